"""A head trial: S of the binding prompts and first-token KL of the neutral prompts under whole-head
scales, measured at run time from recorded baseline passes (runtime.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ...core.edits import HeadScale
from ...core.mcq import Encoded
from ...core.progress import Advance
from ..heads.scores import s_scores
from .runtime import Keep, Recorded, first_token_kl, gather, last_logprobs, passes, record


def binding_s(model, recorded: Recorded, scales: Sequence[HeadScale], option_ids) -> np.ndarray:
    """S of every binding prompt under ``scales``, a batch at a time (no vocabulary-wide rows kept)."""
    rows = [s_scores(lp, option_ids).numpy().astype(np.float64) for _, lp in passes(model, recorded, scales)]
    return gather(recorded, np.concatenate(rows) if rows else np.zeros(0))


@dataclass
class HeadTrials:
    """The binding prompts (match rows, then mismatch rows) and the neutral prompts of one split,
    recorded once; :meth:`measure` runs a trial's scales on both."""

    model: object
    binding: Recorded
    neutral: Recorded
    option_ids: dict[str, tuple[int, ...]]
    neutral_base: torch.Tensor  # baseline log-probabilities of this rank's neutral prompts
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
        keep: Keep | None = None,
    ) -> HeadTrials:
        b = record(model, binding, batch_size, advance, keep=keep)
        n = record(model, neutral, batch_size, advance, keep=keep)
        base = binding_s(model, b, (), option_ids)
        return cls(model, b, n, option_ids, last_logprobs(model, n, ()), base)

    def measure(self, scales: Sequence[HeadScale]) -> tuple[np.ndarray, np.ndarray]:
        """(S of every binding prompt, first-token KL of every neutral prompt) under ``scales``."""
        s = binding_s(self.model, self.binding, scales, self.option_ids)
        kl = first_token_kl(self.neutral_base, last_logprobs(self.model, self.neutral, scales))
        return s, gather(self.neutral, kl)
