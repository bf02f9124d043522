"""Batches of the binding prompts' token ids (surgery.core.mcq encodes each prompt).

Batches are left-padded with explicit position ids, so that the last position is the
answer position of every row and a row's result does not depend on its batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from ...core.errors import SurgeryError
from ...core.mcq import Encoded


@dataclass(frozen=True)
class Batch:
    """Left-padded rows; ``masks[name]`` is a (B, L) bool mask of the span in padded positions."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    masks: dict[str, torch.Tensor]
    index: tuple[int, ...]  # position of every row in the input sequence

    def model_inputs(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "position_ids": self.position_ids}


def collate(
    rows: Sequence[Encoded], index: Sequence[int], pad_id: int, names: Sequence[str], device: torch.device | str = "cpu"
) -> Batch:
    """Left-pad ``rows`` into one batch with span masks for ``names``."""
    length = max(len(r.ids) for r in rows)
    n = len(rows)
    ids = torch.full((n, length), pad_id, dtype=torch.long)
    att = torch.zeros((n, length), dtype=torch.long)
    masks = {name: torch.zeros((n, length), dtype=torch.bool) for name in names}
    for b, r in enumerate(rows):
        pad = length - len(r.ids)
        ids[b, pad:] = torch.tensor(r.ids, dtype=torch.long)
        att[b, pad:] = 1
        for name in names:
            pos = [pad + p for p in r.spans.get(name, ())]
            masks[name][b, pos] = True
    pos_ids = (att.cumsum(-1) - 1).clamp(min=0)
    return Batch(
        ids.to(device), att.to(device), pos_ids.to(device), {k: v.to(device) for k, v in masks.items()}, tuple(index)
    )


def batches(
    rows: Sequence[Encoded], batch_size: int, pad_id: int, names: Sequence[str] = (), device: torch.device | str = "cpu"
) -> Iterator[Batch]:
    """Batches of similar length (less padding); ``Batch.index`` maps rows back to ``rows``."""
    for idx in batch_groups(rows, batch_size):
        yield collate([rows[i] for i in idx], idx, pad_id, names, device)


def batch_groups(rows: Sequence[Encoded], batch_size: int) -> list[list[int]]:
    """The row indices of each batch, shortest rows first (:func:`batches` collates them; under
    torchrun each rank takes whole groups, so a batch is the same in every run)."""
    if batch_size < 1:
        raise SurgeryError(f"--batch-size must be ≥ 1, got {batch_size}")
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].ids))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
