"""Fairness pruning scores and neuron selection (PAPERS.md §2).

Per neuron (layer l, index i) and category c, over that category's pairs:
  BiasScore        mean |pooled₁ − pooled₂|
  signed BiasScore mean (pooled_stereotyped − pooled_other)
  PPM              max(gate_row) + |min(gate_row)| + max(up_row) + |min(up_row)|
  Fairness         w·minmax_l(BiasScore) + (1 − w)·(1 − minmax_l(PPM)), min-max within each layer
Pooled scores (several categories) weight each category by its number of pairs.
Selection: global top-n, per-category top-n (round robin), or the intersection of the categories'
top lists (the study's rule), optionally restricted to some layers.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from .capture import capture_pooled
from .errors import SurgeryError
from .interventions import layer_module, model_architecture
from .pairs import PromptPair

SCORES = ("bias", "signed", "fairness")
RULES = ("global", "per-category", "intersection")
DEFAULT_BIAS_WEIGHT = 0.8
DEFAULT_SCORE = "fairness"
DEFAULT_RULE = "per-category"
DIGITS = 6  # significant digits kept in findings files: ranks are stable, files stay small


class SelectionError(SurgeryError):
    """A neuron selection cannot be made from these findings with these options."""


@dataclass
class PairSums:
    """Streaming sums per category: |p₁ − p₂| and (stereotyped − other), each [layers, width]."""

    counts: Counter = field(default_factory=Counter)
    abs_sum: dict[str, np.ndarray] = field(default_factory=dict)
    signed_sum: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, category: str, diff: np.ndarray, signs: np.ndarray) -> None:
        """Add a stack of pair differences p₁ − p₂ ([pairs, layers, width]) of one category."""
        if category not in self.abs_sum:
            self.abs_sum[category] = np.zeros(diff.shape[1:], dtype=np.float64)
            self.signed_sum[category] = np.zeros(diff.shape[1:], dtype=np.float64)
        self.counts[category] += diff.shape[0]
        self.abs_sum[category] += np.abs(diff).sum(axis=0)
        self.signed_sum[category] += (diff * signs[:, None, None]).sum(axis=0)


def accumulate_pair_sums(model: nn.Module, tokenizer, pairs: Sequence[PromptPair], batch_size: int = 16,
                         progress: Callable[[int], None] = lambda n: None) -> PairSums:
    """Capture both prompts of every pair (batch_size pairs per forward pass) into PairSums."""
    texts = [t for p in pairs for t in (p.prompt_1, p.prompt_2)]
    sums = PairSums()

    def on_batch(start: int, pooled: torch.Tensor) -> None:
        values = pooled.double().numpy()
        diff = values[0::2] - values[1::2]  # batches hold whole pairs: the batch size is even
        batch_pairs = pairs[start // 2: start // 2 + diff.shape[0]]
        categories = np.array([p.category for p in batch_pairs])
        signs = np.array([p.sign for p in batch_pairs], dtype=np.float64)
        for cat in dict.fromkeys(categories.tolist()):
            rows = categories == cat
            sums.add(cat, diff[rows], signs[rows])

    capture_pooled(model, tokenizer, texts, on_batch, batch_size=2 * batch_size, progress=progress)
    return sums


def ppm_scores(model: nn.Module) -> np.ndarray:
    """PPM of every neuron, [layers, width], from the gate and up rows (Phi-3: fused gate_up)."""
    arch = model_architecture(model)
    g = arch.geometry
    out = np.zeros((g.num_layers, g.intermediate_size), dtype=np.float64)
    for layer in range(g.num_layers):
        if arch.layout.gate_up_proj:
            w = layer_module(model, arch, layer, arch.layout.gate_up_proj).weight.detach().float()
            gate, up = w[: g.intermediate_size], w[g.intermediate_size:]
        else:
            gate = layer_module(model, arch, layer, arch.layout.gate_proj).weight.detach().float()
            up = layer_module(model, arch, layer, arch.layout.up_proj).weight.detach().float()
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
    """Per-category BiasScore and signed BiasScore, and PPM, for every neuron of a model."""

    counts: dict[str, int]
    bias: dict[str, np.ndarray]
    signed: dict[str, np.ndarray]
    ppm: np.ndarray

    @classmethod
    def from_sums(cls, sums: PairSums, ppm: np.ndarray) -> "NeuronScores":
        cats = sorted(sums.counts)
        counts = {c: int(sums.counts[c]) for c in cats}
        # Rounded here as in the file, so a fresh run selects exactly what a cached one does.
        table = cls(counts, {c: sums.abs_sum[c] / counts[c] for c in cats},
                    {c: sums.signed_sum[c] / counts[c] for c in cats}, ppm)
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
                                   "signed": rounded(self.signed[c])} for c in self.categories}}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "NeuronScores":
        try:
            cats = raw["categories"]
            ppm = np.asarray(raw["ppm"], dtype=np.float64)
            table = cls({c: int(v["pairs"]) for c, v in cats.items()},
                        {c: np.asarray(v["bias"], dtype=np.float64) for c, v in cats.items()},
                        {c: np.asarray(v["signed"], dtype=np.float64) for c, v in cats.items()}, ppm)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise SelectionError("the findings have no readable neuron scores; recompute them with "
                                 "surgery find-neurons") from None
        shape = (int(raw.get("layers", -1)), int(raw.get("width", -1)))
        arrays = [ppm, *table.bias.values(), *table.signed.values()]
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
        """Pair-weighted mean of 'bias' or 'signed' over ``categories``."""
        source = self.bias if kind == "bias" else self.signed
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


@dataclass(frozen=True)
class Selection:
    """Chosen neurons, best first, with the options that chose them."""

    neurons: tuple[tuple[int, int], ...]
    labels: tuple[str, ...]  # the category each neuron was chosen for ("all" / "pooled" otherwise)
    score: str
    rule: str
    categories: tuple[str, ...]
    layers: tuple[int, ...] | None
    bias_weight: float


def _ranking(values: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Flat neuron indices, best first, among the allowed ones (stable for ties)."""
    flat = np.where(allowed.ravel(), values.ravel(), -np.inf)
    order = np.argsort(-flat, kind="stable")
    return order[: int(allowed.sum())]


def _layer_mask(shape: tuple[int, int], layers: Sequence[int] | None) -> np.ndarray:
    mask = np.zeros(shape, dtype=bool)
    if layers is None:
        mask[:] = True
        return mask
    bad = [layer for layer in layers if not 0 <= layer < shape[0]]
    if bad:
        raise SelectionError(f"--layers {bad} do not exist: the model has layers 0..{shape[0] - 1}")
    mask[sorted(set(layers))] = True
    return mask


def select(scores: NeuronScores, n: int, *, score: str = "fairness", rule: str = "global",
           categories: Sequence[str] | None = None, layers: Sequence[int] | None = None,
           bias_weight: float = DEFAULT_BIAS_WEIGHT) -> Selection:
    """Choose ``n`` neurons by ``score`` with ``rule`` (see the module docstring)."""
    if rule not in RULES:
        raise SelectionError(f"unknown selection rule {rule!r}; choose one of {', '.join(RULES)}")
    cats = scores.resolve(categories)
    allowed = _layer_mask(scores.shape, layers)
    available = int(allowed.sum())
    if n < 1 or n > available:
        raise SelectionError(f"--n {n} is out of range: {'these layers hold' if layers else 'the model has'} "
                             f"{available} MLP neurons ({allowed.any(1).sum()} layers × {scores.shape[1]}); "
                             f"choose 1..{available}")
    width = scores.shape[1]
    if rule == "global":
        order = _ranking(scores.score(score, cats, bias_weight), allowed)[:n]
        labels = ["pooled"] * n
    elif rule == "per-category":
        order, labels = _round_robin([_ranking(scores.score(score, [c], bias_weight), allowed) for c in cats],
                                     cats, n)
    else:
        order = _intersection([_ranking(scores.score(score, [c], bias_weight), allowed) for c in cats],
                              _ranking(scores.score(score, cats, bias_weight), allowed), n)
        labels = ["all"] * n
    neurons = tuple((int(i) // width, int(i) % width) for i in order)
    return Selection(neurons, tuple(labels), score, rule, tuple(cats),
                     None if layers is None else tuple(sorted(set(layers))), bias_weight)


def _round_robin(rankings: list[np.ndarray], cats: list[str], n: int) -> tuple[list[int], list[str]]:
    """Take each category's next best neuron in turn, skipping ones already taken."""
    taken: dict[int, str] = {}
    cursors = [0] * len(rankings)
    while len(taken) < n:
        for k, ranking in enumerate(rankings):
            while cursors[k] < len(ranking) and int(ranking[cursors[k]]) in taken:
                cursors[k] += 1
            if cursors[k] < len(ranking) and len(taken) < n:
                taken[int(ranking[cursors[k]])] = cats[k]
    return list(taken), list(taken.values())


def _intersection(rankings: list[np.ndarray], pooled: np.ndarray, n: int) -> list[int]:
    """The smallest top-k of every category whose intersection holds n neurons; ties by pooled rank.

    A neuron is in every category's top-k exactly when its worst rank across categories is < k,
    so sorting by that worst rank grows the intersection one k at a time (ties at the last k go to
    the better pooled rank). Every ranking lists the same (allowed) neurons; the result is in pooled
    order.
    """
    size = int(pooled.max()) + 1
    worst = np.zeros(size, dtype=np.int64)
    for ranking in rankings:
        rank = np.zeros(size, dtype=np.int64)
        rank[ranking] = np.arange(len(ranking))
        worst = np.maximum(worst, rank)
    pooled_rank = np.zeros(size, dtype=np.int64)
    pooled_rank[pooled] = np.arange(len(pooled))
    chosen = pooled[np.lexsort((pooled_rank[pooled], worst[pooled]))][:n]
    return [int(i) for i in chosen[np.argsort(pooled_rank[chosen], kind="stable")]]  # best pooled first


def layer_distribution(selection: Selection, num_layers: int) -> list[int]:
    """How many selected neurons each layer holds."""
    counts = [0] * num_layers
    for layer, _ in selection.neurons:
        counts[layer] += 1
    return counts


def category_overlap(scores: NeuronScores, n: int, *, score: str = "fairness",
                     categories: Sequence[str] | None = None, layers: Sequence[int] | None = None,
                     bias_weight: float = DEFAULT_BIAS_WEIGHT) -> dict[str, Any]:
    """Jaccard index between the categories' top-n sets (how much their circuits overlap)."""
    cats = scores.resolve(categories)
    tops = [set(select(scores, n, score=score, rule="global", categories=[c], layers=layers,
                       bias_weight=bias_weight).neurons) for c in cats]
    matrix = [[round(len(a & b) / len(a | b), 4) for b in tops] for a in tops]
    return {"categories": cats, "n": n, "score": score, "jaccard": matrix}


def neuron_rows(scores: NeuronScores, selection: Selection) -> list[dict[str, Any]]:
    """One record per selected neuron: its scores (pooled over the selection's categories)."""
    cats = list(selection.categories)
    bias = scores.pooled("bias", cats)
    signed = scores.pooled("signed", cats)
    fair = fairness_score(bias, scores.ppm, selection.bias_weight)
    rows = []
    for (layer, idx), label in zip(selection.neurons, selection.labels):
        top = max(cats, key=lambda c: scores.bias[c][layer, idx])
        rows.append({"layer": layer, "neuron": idx, "bias": float(bias[layer, idx]),
                     "signed": float(signed[layer, idx]), "ppm": float(scores.ppm[layer, idx]),
                     "fairness": float(fair[layer, idx]), "chosen_for": label, "top_category": top})
    return rows
