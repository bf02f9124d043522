"""Token ids of the binding prompts, with the token positions of their named character spans.

A question's spans (option texts, the item) are known as character ranges; a fast tokenizer's
offset mapping turns them into token positions inside the full prompt (chat template or base
format). Batches are left-padded with explicit position ids, so that the last position is the
answer position of every row and a row's result does not depend on its batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from ...core.errors import SurgeryError
from .prompting import BASE_ANSWER_START, BASE_CUE, INSTRUCTION, format_mcq, is_instruct


@dataclass(frozen=True)
class Encoded:
    """One prompt: its token ids and, per span name, the token positions it covers."""

    ids: tuple[int, ...]
    spans: dict[str, tuple[int, ...]]


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


def _adds_bos(tokenizer, text: str) -> bool:
    """Chat templates already write BOS as text; adding it again would change the input."""
    bos = getattr(tokenizer, "bos_token", None)
    return not (bos and text.startswith(bos))


def cue_token_id(tokenizer) -> int:
    """The single token "(" that ends a base-model prompt (docs/methods/binding-heads.md)."""
    ids = tokenizer.encode(BASE_CUE, add_special_tokens=False)
    if len(ids) != 1:
        raise SurgeryError(
            f"this tokenizer splits {BASE_CUE!r} into {len(ids)} tokens; the base-model "
            "prompt needs it as one token: use --instruct if the model is chat-tuned"
        )
    return ids[0]


def encode_text(
    tokenizer, text: str, char_spans: Mapping[str, tuple[int, int]], offset: int = 0, extra_ids: Sequence[int] = ()
) -> Encoded:
    """Tokenize ``text`` and map each character span (shifted by ``offset``) to token positions."""
    if not char_spans:  # no positions wanted (plain generation): any tokenizer will do
        ids = tokenizer(text, add_special_tokens=_adds_bos(tokenizer, text))["input_ids"]
        return Encoded(tuple(ids) + tuple(extra_ids), {})
    if not getattr(tokenizer, "is_fast", False):
        raise SurgeryError(
            "token positions need a fast tokenizer (tokenizer.json); this checkpoint "
            "only has a slow one: convert it with transformers first"
        )
    enc = tokenizer(text, add_special_tokens=_adds_bos(tokenizer, text), return_offsets_mapping=True)
    spans = {}
    for name, (s, e) in char_spans.items():
        s, e = s + offset, e + offset
        spans[name] = tuple(i for i, (ts, te) in enumerate(enc["offset_mapping"]) if te > s and ts < e and te > ts)
    return Encoded(tuple(enc["input_ids"]) + tuple(extra_ids), spans)


def encode_question(
    tokenizer, question: str, char_spans: Mapping[str, tuple[int, int]] | None = None, instruct: bool | None = None
) -> Encoded:
    """The prompt of docs/methods/binding-heads.md for ``question``, as token ids: chat template
    (instruct), or base text ending in the answer prefix followed by the "(" token, appended by id
    (as text, "letter (" can tokenize to " (", another token). S scoring and awareness generation
    both use it, so they read the same input; ``char_spans`` are ranges inside ``question``."""
    if instruct is None:
        instruct = is_instruct(tokenizer)
    if instruct:
        text = format_mcq(tokenizer, question, instruct=True)
        extra: tuple[int, ...] = ()
    else:
        text = question + "\n\n" + INSTRUCTION + BASE_ANSWER_START
        extra = (cue_token_id(tokenizer),)
    offset = text.find(question)
    if offset < 0:
        raise SurgeryError("the chat template changed the question text; spans cannot be located")
    return encode_text(tokenizer, text, char_spans or {}, offset, extra)


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
