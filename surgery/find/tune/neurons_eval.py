"""A neuron trial: how differently the model continues the two prompts of each fairness pair, and the
first-token KL of the neutral prompts, under neuron scales measured at run time (runtime.py).

The bias of a pair is the Jensen–Shannon divergence (nats) between the next-token distributions
after its two prompts, which differ only in the demographic attribute: 0 when the model continues
both alike, at most ln 2. It needs no answer options, so it applies to any pair set.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ...core.edits import NeuronScale
from ...core.mcq import Encoded
from ...core.progress import Advance
from ..heads.prompts import batch_groups
from .runtime import Keep, Recorded, first_token_kl, gather, last_logprobs, record


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> np.ndarray:
    """Jensen–Shannon divergence per row of two (n, vocab) log-probability tensors (nats)."""
    m = torch.logsumexp(torch.stack([p, q]), dim=0) - math.log(2.0)
    kl_pm = (p.exp() * (p - m)).sum(-1)
    kl_qm = (q.exp() * (q - m)).sum(-1)
    return (0.5 * (kl_pm + kl_qm)).clamp_min(0.0).double().numpy()


@dataclass
class PairTrials:
    """The two sides of the fairness pairs and the neutral prompts of one split, recorded once."""

    model: object
    first: Recorded
    second: Recorded
    neutral: Recorded
    neutral_base: torch.Tensor  # baseline log-probabilities of this rank's neutral prompts
    pair_base: np.ndarray  # the bias of every pair without an edit

    @classmethod
    def of(
        cls,
        model,
        first: Sequence[Encoded],
        second: Sequence[Encoded],
        neutral: Sequence[Encoded],
        batch_size: int,
        advance: Advance | None = None,
        keep: Keep | None = None,
    ) -> PairTrials:
        # Both sides of a pair in the same batch position (so on the same rank): batches by the longer side.
        longer = [a if len(a.ids) >= len(b.ids) else b for a, b in zip(first, second)]
        groups = batch_groups(longer, batch_size)
        a = record(model, first, batch_size, advance, groups, keep)
        b = record(model, second, batch_size, advance, groups, keep)
        n = record(model, neutral, batch_size, advance, keep=keep)
        base = gather(a, js_divergence(last_logprobs(model, a, ()), last_logprobs(model, b, ())))
        return cls(model, a, b, n, last_logprobs(model, n, ()), base)

    def measure(self, edits: Sequence[NeuronScale]) -> tuple[np.ndarray, np.ndarray]:
        """(bias of every pair, first-token KL of every neutral prompt) under ``edits``."""
        bias = js_divergence(
            last_logprobs(self.model, self.first, edits), last_logprobs(self.model, self.second, edits)
        )
        kl = first_token_kl(self.neutral_base, last_logprobs(self.model, self.neutral, edits))
        return gather(self.first, bias), gather(self.neutral, kl)
