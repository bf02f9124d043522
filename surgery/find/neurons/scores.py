"""Fairness pruning scores (PAPERS.md §2); selection lives in select.py.

Per neuron (layer l, index i) and category c, over that category's pairs:
  BiasScore        mean |pooled₁ − pooled₂|
  signed BiasScore mean (pooled_stereotyped − pooled_other)
  PPM              max(gate_row) + |min(gate_row)| + max(up_row) + |min(up_row)|
  Fairness         w·minmax_l(BiasScore) + (1 − w)·(1 − minmax_l(PPM)), min-max within each layer
  activation       mean |pooled| over the category's prompts (how active the neuron is at all)
Pooled scores (several categories) weight each category by its number of pairs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ...core.errors import SurgeryError
from .pairs import PromptPair
from .params import DEFAULT_BIAS_WEIGHT, SCORES

if TYPE_CHECKING:  # torch is imported where the model runs: `surgery --help` stays fast
    import torch
    from torch import nn

DIGITS = 6  # significant digits kept in findings files: ranks are stable, files stay small


class SelectionError(SurgeryError):
    """Neuron scores or a selection cannot be made from these findings with these options."""


@dataclass
class PairSums:
    """Streaming sums per category, each [layers, width]: |p₁ − p₂|, (stereotyped − other), |p₁| + |p₂|."""

    counts: Counter = field(default_factory=Counter)
    abs_sum: dict[str, np.ndarray] = field(default_factory=dict)
    signed_sum: dict[str, np.ndarray] = field(default_factory=dict)
    mag_sum: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, category: str, pooled_1: np.ndarray, pooled_2: np.ndarray, signs: np.ndarray) -> None:
        """Add the pooled activations ([pairs, layers, width]) of some pairs of one category."""
        if category not in self.abs_sum:
            for sums in (self.abs_sum, self.signed_sum, self.mag_sum):
                sums[category] = np.zeros(pooled_1.shape[1:], dtype=np.float64)
        diff = pooled_1 - pooled_2
        self.counts[category] += diff.shape[0]
        self.abs_sum[category] += np.abs(diff).sum(axis=0)
        self.signed_sum[category] += (diff * signs[:, None, None]).sum(axis=0)
        self.mag_sum[category] += (np.abs(pooled_1) + np.abs(pooled_2)).sum(axis=0)


def accumulate_pair_sums(model: nn.Module, tokenizer, pairs: Sequence[PromptPair], batch_size: int = 16,
                         progress: Callable[[int], None] = lambda n: None) -> PairSums:
    """Capture both prompts of every pair (batch_size pairs per forward pass) into PairSums."""
    from .capture import capture_pooled

    texts = [t for p in pairs for t in (p.prompt_1, p.prompt_2)]
    sums = PairSums()

    def on_batch(start: int, pooled: torch.Tensor) -> None:
        values = pooled.double().numpy()
        first, second = values[0::2], values[1::2]  # batches hold whole pairs: the batch size is even
        batch_pairs = pairs[start // 2: start // 2 + first.shape[0]]
        categories = np.array([p.category for p in batch_pairs])
        signs = np.array([p.sign for p in batch_pairs], dtype=np.float64)
        for cat in dict.fromkeys(categories.tolist()):
            rows = categories == cat
            sums.add(cat, first[rows], second[rows], signs[rows])

    capture_pooled(model, tokenizer, texts, on_batch, batch_size=2 * batch_size, progress=progress)
    return sums


def ppm_scores(model: nn.Module) -> np.ndarray:
    """PPM of every neuron, [layers, width], from the gate and up rows (Phi-3: fused gate_up)."""
    from accelerate.utils import align_module_device

    from ...model.hooks import layer_module, model_architecture

    arch = model_architecture(model)
    g = arch.geometry
    out = np.zeros((g.num_layers, g.intermediate_size), dtype=np.float64)

    def weight(relative: str) -> torch.Tensor:
        module = layer_module(model, arch, layer, relative)
        with align_module_device(module):  # a disk-offloaded module's weight is on "meta" until brought in
            return module.weight.detach().float()

    for layer in range(g.num_layers):
        if arch.layout.gate_up_proj:
            w = weight(arch.layout.gate_up_proj)
            gate, up = w[: g.intermediate_size], w[g.intermediate_size:]
        else:
            gate, up = weight(arch.layout.gate_proj), weight(arch.layout.up_proj)
        ppm = (gate.amax(1) + gate.amin(1).abs() + up.amax(1) + up.amin(1).abs())
        out[layer] = ppm.double().cpu().numpy()
    return out


def minmax_rows(x: np.ndarray) -> np.ndarray:
    """Min-max normalise each row (layer) to [0, 1]; a constant row becomes 0."""
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    span = np.where(hi > lo, hi - lo, 1.0)
    return (x - lo) / span


def fairness_score(bias: np.ndarray, ppm: np.ndarray, weight: float = DEFAULT_BIAS_WEIGHT) -> np.ndarray:
    """w·minmax(BiasScore) + (1 − w)·(1 − minmax(PPM)), normalised within each layer."""
    if not 0.0 <= weight <= 1.0:
        raise SelectionError(f"--bias-weight must be between 0 and 1, got {weight}")
    return weight * minmax_rows(bias) + (1.0 - weight) * (1.0 - minmax_rows(ppm))


def rounded(x: np.ndarray) -> list:
    """Nested lists with DIGITS significant digits (what findings files store)."""
    return [[float(f"{v:.{DIGITS}g}") for v in row] for row in np.asarray(x, dtype=np.float64).tolist()]


@dataclass
class NeuronScores:
    """Per-category BiasScore, signed BiasScore and activation, and PPM, for every neuron of a model."""

    counts: dict[str, int]
    bias: dict[str, np.ndarray]
    signed: dict[str, np.ndarray]
    activation: dict[str, np.ndarray]
    ppm: np.ndarray

    @classmethod
    def from_sums(cls, sums: PairSums, ppm: np.ndarray) -> "NeuronScores":
        cats = sorted(sums.counts)
        counts = {c: int(sums.counts[c]) for c in cats}
        # Rounded here as in the file, so a fresh run selects exactly what a cached one does.
        table = cls(counts, {c: sums.abs_sum[c] / counts[c] for c in cats},
                    {c: sums.signed_sum[c] / counts[c] for c in cats},
                    {c: sums.mag_sum[c] / (2 * counts[c]) for c in cats}, ppm)
        return cls.from_dict(table.to_dict())

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.ppm.shape)  # type: ignore[return-value]

    @property
    def categories(self) -> list[str]:
        return list(self.counts)

    def to_dict(self) -> dict[str, Any]:
        layers, width = self.shape
        return {"layers": layers, "width": width, "ppm": rounded(self.ppm),
                "categories": {c: {"pairs": self.counts[c], "bias": rounded(self.bias[c]),
                                   "signed": rounded(self.signed[c]), "activation": rounded(self.activation[c])}
                               for c in self.categories}}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "NeuronScores":
        try:
            cats = raw["categories"]
            ppm = np.asarray(raw["ppm"], dtype=np.float64)
            table = cls({c: int(v["pairs"]) for c, v in cats.items()},
                        *({c: np.asarray(v[key], dtype=np.float64) for c, v in cats.items()}
                          for key in ("bias", "signed", "activation")), ppm)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise SelectionError("the findings have no readable neuron scores; recompute them with "
                                 "surgery find-neurons") from None
        shape = (int(raw.get("layers", -1)), int(raw.get("width", -1)))
        arrays = [ppm, *table.bias.values(), *table.signed.values(), *table.activation.values()]
        if not cats or any(a.shape != shape for a in arrays):
            raise SelectionError("the findings' score arrays do not match their layers × width; "
                                 "recompute them with surgery find-neurons")
        return table

    def resolve(self, categories: Sequence[str] | None) -> list[str]:
        """Category names (case-insensitive) present in these scores; None means all."""
        if not categories:
            return self.categories
        by_key = {c.lower(): c for c in self.categories}
        unknown = [c for c in categories if c.lower() not in by_key]
        if unknown:
            raise SelectionError(f"category {', '.join(unknown)} is not in the findings; they hold "
                                 f"{', '.join(self.categories)}")
        return list(dict.fromkeys(by_key[c.lower()] for c in categories))

    def pooled(self, kind: str, categories: Sequence[str]) -> np.ndarray:
        """Pair-weighted mean of 'bias', 'signed' or 'activation' over ``categories``."""
        source = {"bias": self.bias, "signed": self.signed, "activation": self.activation}[kind]
        total = sum(self.counts[c] for c in categories)
        return sum(source[c] * self.counts[c] for c in categories) / total

    def score(self, kind: str, categories: Sequence[str], bias_weight: float = DEFAULT_BIAS_WEIGHT) -> np.ndarray:
        """The ranking value of every neuron, [layers, width] (higher = more bias-related)."""
        if kind == "bias":
            return self.pooled("bias", categories)
        if kind == "signed":
            # The magnitude of the consistent stereotyped-vs-other shift is what a factor scales.
            return np.abs(self.pooled("signed", categories))
        if kind == "fairness":
            return fairness_score(self.pooled("bias", categories), self.ppm, bias_weight)
        raise SelectionError(f"unknown score {kind!r}; choose one of {', '.join(SCORES)}")
