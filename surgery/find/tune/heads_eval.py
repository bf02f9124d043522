"""A head trial measured at run time: whole-head scales resumed from recorded baseline passes.

Each batch of binding prompts and of neutral prompts runs once without an edit (resume.snapshot
records every decoder layer's inputs); a trial then reruns only the layers from its lowest scaled
head on (resume.resume_scaled, the full pass's computation bit for bit), with the scales hooked in
at run time (model.hooks.applied). No trial bakes a checkpoint and none repeats the layers below
its first edited one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ...core.edits import HeadScale
from ...core.mcq import Encoded
from ...core.progress import Advance
from ...model.placement import input_device
from ..heads.prompts import batch_groups, collate
from ..heads.resume import Snapshot, resume_scaled, snapshot
from ..heads.scores import SPAN_NAMES, pad_id, s_scores


@dataclass
class Recorded:
    """One prompt set's baseline passes: the snapshot of each batch and the rows it holds."""

    batches: list[tuple[list[int], Snapshot]]
    n: int


def record(model, prompts: Sequence[Encoded], batch_size: int, advance: Advance | None = None) -> Recorded:
    """The baseline pass of every batch of ``prompts`` (left-padded: the last position is each row's)."""
    device, pad, out = input_device(model), pad_id(model), []
    for idx in batch_groups(prompts, batch_size):
        batch = collate([prompts[i] for i in idx], idx, pad, SPAN_NAMES, device)
        out.append((idx, snapshot(model, batch)))
        if advance:
            advance(len(idx))
    return Recorded(out, len(prompts))


def passes(model, recorded: Recorded, scales: Sequence[HeadScale]) -> Iterator[tuple[list[int], torch.Tensor]]:
    """(rows, fp32 log-softmax of their last position) of each batch under ``scales`` (none: baseline)."""
    for idx, snap in recorded.batches:
        logits = resume_scaled(model, snap, scales) if scales else snap.logits
        yield idx, logits.float().log_softmax(-1).cpu()


def last_logprobs(model, recorded: Recorded, scales: Sequence[HeadScale]) -> torch.Tensor:
    """(n, vocab) fp32 log-softmax of the last position of every prompt under ``scales``."""
    rows = [(idx, lp) for idx, lp in passes(model, recorded, scales)]
    out = torch.empty((recorded.n, rows[0][1].shape[-1]), dtype=torch.float32)
    for idx, lp in rows:
        out[idx] = lp
    return out


def binding_s(model, recorded: Recorded, scales: Sequence[HeadScale], option_ids) -> np.ndarray:
    """S of every binding prompt under ``scales``, a batch at a time (no vocabulary-wide rows kept)."""
    out = np.zeros(recorded.n)
    for idx, lp in passes(model, recorded, scales):
        out[idx] = s_scores(lp, option_ids).numpy()
    return out


def first_token_kl(reference: torch.Tensor, edited: torch.Tensor) -> np.ndarray:
    """KL(reference ‖ edited) of the next-token distribution at each prompt's last position: the
    first-token KL of surgery.evaluation.lm.kl_divergence, per prompt."""
    return (reference.exp() * (reference - edited)).sum(-1).clamp_min(0.0).double().numpy()


@dataclass
class HeadTrials:
    """The binding prompts (match rows, then mismatch rows) and the neutral prompts of one split,
    recorded once; :meth:`measure` runs a trial's scales on both."""

    model: object
    binding: Recorded
    neutral: Recorded
    option_ids: dict[str, tuple[int, ...]]
    neutral_base: torch.Tensor  # (n, vocab) baseline log-probabilities of the neutral prompts
    binding_base: np.ndarray  # S of every binding prompt without an edit

    @classmethod
    def of(
        cls,
        model,
        binding: Sequence[Encoded],
        neutral: Sequence[Encoded],
        option_ids: dict[str, tuple[int, ...]],
        batch_size: int,
        advance: Advance | None = None,
    ) -> HeadTrials:
        b, n = record(model, binding, batch_size, advance), record(model, neutral, batch_size, advance)
        base = binding_s(model, b, (), option_ids)
        return cls(model, b, n, option_ids, last_logprobs(model, n, ()), base)

    def measure(self, scales: Sequence[HeadScale]) -> tuple[np.ndarray, np.ndarray]:
        """(S of every binding prompt, first-token KL of every neutral prompt) under ``scales``."""
        s = binding_s(self.model, self.binding, scales, self.option_ids)
        return s, first_token_kl(self.neutral_base, last_logprobs(self.model, self.neutral, scales))
