"""Fairness pruning scores (docs/methods/fairness-pruning.md); PPM lives in ppm.py, selection in select.py.

Per neuron (layer l, index i) and category c, over that category's pairs:
  BiasScore        mean |pooled₁ − pooled₂|
  signed BiasScore mean (pooled_stereotyped − pooled_other)
  PPM              max(gate_row) + |min(gate_row)| + max(up_row) + |min(up_row)|
  Fairness         w·minmax_l(BiasScore) + (1 − w)·(1 − minmax_l(PPM)), min-max within each layer
  activation       mean |pooled| over the category's prompts (how active the neuron is at all)
Pooled scores (several categories) weight each category by its number of pairs.

Mixture-of-experts layers (experts.py): a routed expert's neuron has an activation for a prompt only
when some of its tokens reached the expert. A pair counts for that neuron only when both prompts
did; ``reached`` holds those counts per neuron, the means divide by them, and a neuron no pair
reached has no score (NaN in memory, null in the findings) and is never selected. ``routing``
holds, per category, layer and expert, the mean routing share of the stereotyped side minus the
other's (signed) and its mean absolute difference.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ...core import distributed
from ...core.errors import SurgeryError
from ...core.significant import significant
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
    # Mixtures of experts: pairs whose both prompts reached each neuron's expert, the experts'
    # (count, width, shared width), and the routing-share sums (signed, absolute) [layers, experts].
    reached: dict[str, np.ndarray] = field(default_factory=dict)
    experts: tuple[int, int, int] | None = None
    routing_signed: dict[str, np.ndarray] = field(default_factory=dict)
    routing_abs: dict[str, np.ndarray] = field(default_factory=dict)
    # Dense MLP layers among the expert layers and their width (their neurons are columns 0..width-1).
    dense_layers: tuple[int, ...] = ()
    dense_width: int = 0

    def add(self, category: str, pooled_1: np.ndarray, pooled_2: np.ndarray, signs: np.ndarray) -> None:
        """Add the pooled activations ([pairs, layers, width]; NaN: expert not reached) of some
        pairs of one category."""
        if category not in self.abs_sum:
            for sums in (self.abs_sum, self.signed_sum, self.mag_sum, self.reached):
                sums[category] = np.zeros(pooled_1.shape[1:], dtype=np.float64)
        diff = pooled_1 - pooled_2
        missed = ~np.isfinite(diff)  # an expert a prompt did not reach: counts as 0
        self.counts[category] += diff.shape[0]
        self.reached[category] += diff.shape[0] - missed.sum(axis=0)
        self.abs_sum[category] += _zeroed(np.abs(diff), missed).sum(axis=0)
        self.signed_sum[category] += _zeroed(diff * signs[:, None, None], missed).sum(axis=0)
        self.mag_sum[category] += _zeroed(np.abs(pooled_1) + np.abs(pooled_2), missed).sum(axis=0)

    def add_routing(self, category: str, share_1: np.ndarray, share_2: np.ndarray, signs: np.ndarray) -> None:
        """Add the routing shares ([pairs, layers, experts]) of some pairs of one category."""
        if category not in self.routing_signed:
            for sums in (self.routing_signed, self.routing_abs):
                sums[category] = np.zeros(share_1.shape[1:], dtype=np.float64)
        diff = share_1 - share_2
        self.routing_signed[category] += (diff * signs[:, None, None]).sum(axis=0)
        self.routing_abs[category] += np.abs(diff).sum(axis=0)

    def mean_abs(self) -> np.ndarray:
        """mean |p₁ − p₂| over every pair of every category, [layers, width] (a dense model's sums):
        optipfair's ``analyze_neuron_bias`` score, which knows no categories."""
        if self.experts is not None:
            raise SurgeryError("mean_abs is defined for dense models: an expert neuron is not reached by every pair")
        return sum(self.abs_sum.values()) / sum(self.counts.values())

    def all_reduced(self, categories: Sequence[str], shape: tuple[int, int]) -> PairSums:
        """The sums over every torchrun rank (each holds its shard's; in a single process, these).

        ``categories`` are those of all pairs, so ranks that saw none of a category still take
        part; ``shape`` is [layers, width]. In float64; a mixture of experts also adds up its
        reached-pair counts and routing shares, so its scores are the single process's too.
        """
        if not distributed.under_torchrun():
            return self
        cats = sorted(categories)
        fields = ("abs_sum", "signed_sum", "mag_sum") + (("reached",) if self.experts else ())
        # one all_reduce per shape: [category, field + the pair count, layers, width]
        stacked = np.zeros((len(cats), len(fields) + 1) + tuple(shape), dtype=np.float64)
        routing = np.zeros((len(cats), 2, shape[0], self.experts[0] if self.experts else 0), dtype=np.float64)
        for k, c in enumerate(cats):
            if self.counts[c]:
                stacked[k, :-1] = [getattr(self, f)[c] for f in fields]
                stacked[k, -1] = self.counts[c]
                if self.experts:
                    routing[k] = self.routing_signed[c], self.routing_abs[c]
        total = distributed.all_reduce(stacked)
        routing = distributed.all_reduce(routing) if self.experts else routing
        out = PairSums(experts=self.experts, dense_layers=self.dense_layers, dense_width=self.dense_width)
        for k, c in enumerate(cats):
            count = int(round(total[k, -1, 0, 0]))
            if count:
                out.counts[c] = count
                for j, f in enumerate(fields):
                    getattr(out, f)[c] = total[k, j]
                if self.experts:
                    out.routing_signed[c], out.routing_abs[c] = routing[k, 0], routing[k, 1]
        return out


def accumulate_pair_sums(
    model: nn.Module,
    tokenizer,
    pairs: Sequence[PromptPair],
    batch_size: int = 16,
    progress: Callable[[int], None] = lambda n: None,
    site: str | None = None,
) -> PairSums:
    """Capture both prompts of every pair (batch_size pairs per forward pass) into PairSums.

    ``site``: a dense model's capture site (capture.SITES; None: the down_proj input, what the
    scores are defined on); the gate/up outputs give sums [layers, 2·I], for comparisons only.
    """
    from ...model.hooks import model_architecture
    from .capture import DOWN_PROJ_INPUT, capture_pooled
    from .experts import capture_experts, dense_layers

    texts = [t for p in pairs for t in (p.prompt_1, p.prompt_2)]
    sums = PairSums()

    def on_batch(start: int, pooled: torch.Tensor, routing: torch.Tensor | None = None) -> None:
        values = pooled.double().numpy()
        first, second = values[0::2], values[1::2]  # batches hold whole pairs: the batch size is even
        batch_pairs = pairs[start // 2 : start // 2 + first.shape[0]]
        categories = np.array([p.category for p in batch_pairs])
        signs = np.array([p.sign for p in batch_pairs], dtype=np.float64)
        for cat in dict.fromkeys(categories.tolist()):
            rows = categories == cat
            sums.add(cat, first[rows], second[rows], signs[rows])
            if routing is not None:
                share = routing.double().numpy()
                sums.add_routing(cat, share[0::2][rows], share[1::2][rows], signs[rows])

    g = model_architecture(model).geometry
    if g.sparse_layers:
        if site not in (None, DOWN_PROJ_INPUT):
            raise SurgeryError(f"a mixture of experts is captured at its experts' down_proj input, not {site}")
        sums.experts = (g.num_experts, g.expert_size, g.shared_size)
        sums.dense_layers = tuple(dense_layers(model_architecture(model)))
        sums.dense_width = g.intermediate_size if sums.dense_layers else 0
        capture_experts(model, tokenizer, texts, on_batch, batch_size=2 * batch_size, progress=progress)
    else:
        capture_pooled(
            model,
            tokenizer,
            texts,
            on_batch,
            batch_size=2 * batch_size,
            progress=progress,
            site=site or DOWN_PROJ_INPUT,
        )
    return sums


def _zeroed(values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """``values`` with ``where`` set to 0, in place: one batch-sized array less than ``np.where`` makes."""
    values[where] = 0.0
    return values


def minmax_rows(x: np.ndarray) -> np.ndarray:
    """Min-max normalise each row (layer) to [0, 1]; a constant row becomes 0."""
    if np.isnan(x).all(axis=1).any():  # a layer with no score at all: keep it unscored
        x = np.where(np.isnan(x).all(axis=1, keepdims=True), 0.0, x)
    lo, hi = np.nanmin(x, axis=1, keepdims=True), np.nanmax(x, axis=1, keepdims=True)
    span = np.where(hi > lo, hi - lo, 1.0)
    return (x - lo) / span


def fairness_score(bias: np.ndarray, ppm: np.ndarray, weight: float = DEFAULT_BIAS_WEIGHT) -> np.ndarray:
    """w·minmax(BiasScore) + (1 − w)·(1 − minmax(PPM)), normalised within each layer."""
    if not 0.0 <= weight <= 1.0:
        raise SelectionError(f"--bias-weight must be between 0 and 1, got {weight}")
    return weight * minmax_rows(bias) + (1.0 - weight) * (1.0 - minmax_rows(ppm))


def rounded(x: np.ndarray) -> list:
    """Nested lists (rows of a 2-D array) with DIGITS significant digits, each value what
    ``float(f"{v:.6g}")`` gives (what findings files store); NaN (no score) → null."""
    values = significant(np.asarray(x, dtype=np.float64), DIGITS)
    rows = values.tolist()
    for i in np.flatnonzero(np.isnan(values).any(axis=1)):  # only a mixture of experts has unscored neurons
        rows[i] = [None if v != v else v for v in rows[i]]
    return rows


@dataclass
class NeuronScores:
    """Per-category BiasScore, signed BiasScore and activation, and PPM, for every neuron of a model."""

    counts: dict[str, int]
    bias: dict[str, np.ndarray]
    signed: dict[str, np.ndarray]
    activation: dict[str, np.ndarray]
    ppm: np.ndarray
    # Mixtures of experts only (see the module docstring): pairs that reached each neuron, the
    # experts' (count, width, shared width), and per category the routing difference
    # {"signed": [layers, E], "abs": [layers, E]}.
    reached: dict[str, np.ndarray] | None = None
    experts: tuple[int, int, int] | None = None
    routing: dict[str, dict[str, np.ndarray]] | None = None
    # Dense MLP layers among the expert layers (their neurons: columns 0..dense_width-1), their width.
    dense_layers: tuple[int, ...] = ()
    dense_width: int = 0

    @classmethod
    def from_sums(cls, sums: PairSums, ppm: np.ndarray) -> NeuronScores:
        """The scores of these sums, rounded as in the file, so a fresh run selects exactly what a
        cached one does."""
        return cls.from_dict(cls.stored(sums, ppm))

    @classmethod
    def stored(cls, sums: PairSums, ppm: np.ndarray) -> dict[str, Any]:
        """The scores of these sums as a findings file stores them (:meth:`to_dict`, DIGITS
        significant digits): ``from_dict`` of it is :meth:`from_sums`, and its ``to_dict`` is it again."""
        cats = sorted(sums.counts)
        counts = {c: int(sums.counts[c]) for c in cats}
        if sums.experts is None:
            table = cls(
                counts,
                {c: sums.abs_sum[c] / counts[c] for c in cats},
                {c: sums.signed_sum[c] / counts[c] for c in cats},
                {c: sums.mag_sum[c] / (2 * counts[c]) for c in cats},
                ppm,
            )
            return table.to_dict()
        with np.errstate(invalid="ignore", divide="ignore"):  # 0 pairs reached: NaN, no score
            per = {c: np.where(sums.reached[c] > 0, sums.reached[c], np.nan) for c in cats}
            table = cls(
                counts,
                {c: sums.abs_sum[c] / per[c] for c in cats},
                {c: sums.signed_sum[c] / per[c] for c in cats},
                {c: sums.mag_sum[c] / (2 * per[c]) for c in cats},
                ppm,
                {c: sums.reached[c] for c in cats},
                sums.experts,
                {
                    c: {"signed": sums.routing_signed[c] / counts[c], "abs": sums.routing_abs[c] / counts[c]}
                    for c in cats
                },
                sums.dense_layers,
                sums.dense_width,
            )
        return table.to_dict()

    def expert_of(self, layer: int, column: int) -> tuple[int | str | None, int]:
        """(expert, neuron) of a layer's column: (None, i) in a dense model or a dense layer, (e, i)
        routed, ("shared", j)."""
        if self.experts is None or layer in self.dense_layers:
            return None, column
        count, width, _ = self.experts
        if column < count * width:
            return column // width, column % width
        return "shared", column - count * width

    def neurons(self) -> np.ndarray:
        """[layers, width] booleans: the columns that are a neuron (a dense layer among expert
        layers has fewer neurons than the row has columns)."""
        real = np.ones(self.shape, dtype=bool)
        if self.experts is not None:
            count, width, shared = self.experts
            real[:, count * width + shared :] = False
            real[list(self.dense_layers)] = np.arange(self.shape[1]) < self.dense_width
        return real

    def unscored(self) -> int:
        """Neurons no pair of any category reached (mixtures of experts): they have no score."""
        if self.reached is None:
            return 0
        return int(((sum(self.reached.values()) == 0) & self.neurons()).sum())

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.ppm.shape)  # type: ignore[return-value]

    @property
    def categories(self) -> list[str]:
        return list(self.counts)

    def to_dict(self) -> dict[str, Any]:
        layers, width = self.shape
        out = {
            "layers": layers,
            "width": width,
            "ppm": rounded(self.ppm),
            "categories": {
                c: {
                    "pairs": self.counts[c],
                    "bias": rounded(self.bias[c]),
                    "signed": rounded(self.signed[c]),
                    "activation": rounded(self.activation[c]),
                }
                for c in self.categories
            },
        }
        if self.experts is not None:
            count, size, shared = self.experts
            out["experts"] = {"count": count, "width": size, "shared_width": shared}
            if self.dense_layers:  # files of models without dense layers read and write as before
                out["experts"].update(dense_layers=list(self.dense_layers), dense_width=self.dense_width)
            for c in self.categories:
                out["categories"][c]["reached"] = self.reached[c].astype(int).tolist()
                out["categories"][c]["routing"] = {k: rounded(v) for k, v in self.routing[c].items()}
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> NeuronScores:
        try:
            cats = raw["categories"]
            ppm = np.asarray(raw["ppm"], dtype=np.float64)
            table = cls(
                {c: int(v["pairs"]) for c, v in cats.items()},
                *(
                    {c: np.asarray(v[key], dtype=np.float64) for c, v in cats.items()}
                    for key in ("bias", "signed", "activation")
                ),
                ppm,
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise SelectionError(
                "the findings have no readable neuron scores; recompute them with surgery find-neurons"
            ) from None
        if raw.get("experts") is not None:
            try:
                ex = raw["experts"]
                table.experts = (int(ex["count"]), int(ex["width"]), int(ex["shared_width"]))
                table.dense_layers = tuple(int(i) for i in ex.get("dense_layers", ()))
                table.dense_width = int(ex.get("dense_width", 0))
                table.reached = {c: np.asarray(v["reached"], dtype=np.float64) for c, v in cats.items()}
                table.routing = {
                    c: {k: np.asarray(v["routing"][k], dtype=np.float64) for k in ("signed", "abs")}
                    for c, v in cats.items()
                }
            except (KeyError, TypeError, ValueError):
                raise SelectionError(
                    "the findings' expert scores are unreadable; recompute them with surgery find-neurons"
                ) from None
        shape = (int(raw.get("layers", -1)), int(raw.get("width", -1)))
        arrays = [
            ppm,
            *table.bias.values(),
            *table.signed.values(),
            *table.activation.values(),
            *(table.reached or {}).values(),
        ]
        if not cats or any(a.shape != shape for a in arrays):
            raise SelectionError(
                "the findings' score arrays do not match their layers × width; recompute them with surgery find-neurons"
            )
        return table

    def resolve(self, categories: Sequence[str] | None) -> list[str]:
        """Category names (case-insensitive) present in these scores; None means all."""
        if not categories:
            return self.categories
        by_key = {c.lower(): c for c in self.categories}
        unknown = [c for c in categories if c.lower() not in by_key]
        if unknown:
            raise SelectionError(
                f"category {', '.join(unknown)} is not in the findings; they hold {', '.join(self.categories)}"
            )
        return list(dict.fromkeys(by_key[c.lower()] for c in categories))

    def pooled(self, kind: str, categories: Sequence[str]) -> np.ndarray:
        """Pair-weighted mean of 'bias', 'signed' or 'activation' over ``categories``."""
        source = {"bias": self.bias, "signed": self.signed, "activation": self.activation}[kind]
        if self.reached is not None:  # weight by the pairs that reached each neuron; none: NaN
            total = sum(self.reached[c] for c in categories)
            weighted = sum(np.nan_to_num(source[c]) * self.reached[c] for c in categories)
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(total > 0, weighted / total, np.nan)
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
