"""Brute-force ground truth for the planted bias: every MLP neuron zeroed, one at a time.

Measured on the task's pairs (every prompt of the task belongs to exactly one pair), from the
log-odds d = logit(hire) − logit(reject) after each prompt:

- *bias gap*: mean over pairs of d(other) − d(stereotyped), the signed advantage of the favoured
  group (2·bias by construction); the *absolute gap* mean |d(prompt_1) − d(prompt_2)| is kept too;
- *capability margin*: mean over every prompt of d · (+1 skilled, −1 unskilled); the bias term
  cancels in it because every prompt appears with both groups.

Effect of an ablation = (1 − ablated / intact) · 100 %: 100 % removes the bias (or the capability),
negative values increase it. A neuron is zeroed with surgery's run-time hook
(``surgery.model.hooks.applied`` + ``NeuronScale(layer, neuron, 0)``: the down_proj input of that
neuron is 0, which is what zeroing its gate/up rows and down column does); nothing of surgery's
scoring is used.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from tests.planted.bias_task import BiasPair, BiasWorld, pairs
from tests.planted.bias_train import log_odds


@dataclass(frozen=True)
class Metrics:
    """Bias gap, absolute gap and capability margin of one model state."""

    gap: float
    abs_gap: float
    capability: float


@dataclass(frozen=True)
class NeuronEffect:
    """One neuron's brute-force effects, in % of the intact model's values."""

    layer: int
    neuron: int
    bias: float  # on the signed bias gap
    abs_bias: float  # on the absolute gap
    capability: float


class BiasProbe:
    """The task's pairs, laid out prompt_1, prompt_2, prompt_1, …, and their metrics."""

    def __init__(self, world: BiasWorld) -> None:
        self.pairs: list[BiasPair] = pairs(world)
        self.texts = [p.text for pair in self.pairs for p in (pair.first, pair.second)]
        # +1 where prompt_1 is the favoured side: (d1 − d2)·sign = d(other) − d(stereotyped).
        self.sign = torch.tensor([1.0 if pair.stereotyped == 2 else -1.0 for pair in self.pairs])
        self.skilled = torch.tensor(
            [1.0 if p.skilled else -1.0 for pair in self.pairs for p in (pair.first, pair.second)]
        )

    def metrics_of(self, d: torch.Tensor) -> Metrics:
        diff = d[0::2] - d[1::2]
        return Metrics((diff * self.sign).mean().item(), diff.abs().mean().item(), (d * self.skilled).mean().item())

    def measure(self, model, tokenizer, zeroed: Iterable[tuple[int, int]] = ()) -> Metrics:
        """Metrics with the neurons ``zeroed`` (layer, index) silenced at run time."""
        from surgery.core.edits import NeuronScale
        from surgery.model.hooks import applied

        with applied(model, [NeuronScale(layer, i, 0.0) for layer, i in zeroed]):
            return self.metrics_of(log_odds(model, tokenizer, self.texts))


def effect(ablated: float, base: float) -> float:
    return (1.0 - ablated / base) * 100.0


def effects(base: Metrics, ablated: Metrics) -> tuple[float, float, float]:
    """(bias, absolute bias, capability) effects in % of ``base``."""
    return (
        effect(ablated.gap, base.gap),
        effect(ablated.abs_gap, base.abs_gap),
        effect(ablated.capability, base.capability),
    )


def brute_force(model, tokenizer, probe: BiasProbe) -> tuple[Metrics, list[NeuronEffect]]:
    """The intact metrics and every neuron's effects, largest bias effect first."""
    cfg = model.config
    base = probe.measure(model, tokenizer)
    rows = [
        NeuronEffect(layer, i, *effects(base, probe.measure(model, tokenizer, [(layer, i)])))
        for layer in range(cfg.num_hidden_layers)
        for i in range(cfg.intermediate_size)
    ]
    return base, sorted(rows, key=lambda r: -r.bias)


def ranking(rows: Sequence[NeuronEffect]) -> list[tuple[int, int]]:
    return [(r.layer, r.neuron) for r in rows]
