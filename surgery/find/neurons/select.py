"""Choosing neurons from NeuronScores: global top-n, per-category turns, or the categories' intersection.

Every rule ranks only *allowed* neurons: those in the chosen layers and not among the most active
neurons of their layer (``spare_active``). On SmolLM2-135M the neurons whose removal breaks the model
("The capital of France is" → no Paris) are the 1–5 most active of their layer (massive
activations), and PPM, a weight statistic, does not flag them; sparing the top 1% by mean |activation|
keeps them out while leaving the bias ranking otherwise unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core.edits import NeuronScale, neuron_label
from .params import DEFAULT_BIAS_WEIGHT, DEFAULT_RULE, DEFAULT_SCORE, DEFAULT_SPARE, RULES
from .scores import NeuronScores, SelectionError, fairness_score


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
    spare_active: float

    def options(self) -> dict[str, Any]:
        """The options as recorded in findings summaries and surgery.json."""
        return {
            "n": len(self.neurons),
            "score": self.score,
            "rule": self.rule,
            "bias_weight": self.bias_weight,
            "spare_active": self.spare_active,
            "categories": list(self.categories),
            "layers": self.layers,
        }


def allowed_mask(scores: NeuronScores, layers: Sequence[int] | None, spare_active: float) -> np.ndarray:
    """[layers, width] booleans: in the chosen layers and not among each layer's most active neurons."""
    n_layers, width = scores.shape
    bad = [layer for layer in layers or () if not 0 <= layer < n_layers]
    if bad:
        raise SelectionError(f"--layers {bad} do not exist: the model has layers 0..{n_layers - 1}")
    if not 0.0 <= spare_active < 1.0:
        raise SelectionError(f"--spare-active must be a fraction in [0, 1), got {spare_active}")
    mask = np.zeros(scores.shape, dtype=bool)
    mask[sorted(set(layers)) if layers is not None else slice(None)] = True
    if scores.reached is not None:  # expert neurons no pair reached have no score: never chosen
        mask &= sum(scores.reached.values()) > 0
    spared = math.ceil(spare_active * width)
    if spared:
        activity = scores.pooled("activation", scores.categories)  # a property of the model: all pairs
        top = np.argsort(-activity, axis=1, kind="stable")[:, :spared]
        np.put_along_axis(mask, top, False, axis=1)
    return mask


def _ranking(values: np.ndarray, allowed: np.ndarray, limit: int | None = None) -> np.ndarray:
    """Flat neuron indices, best first, among the allowed ones (stable for ties); with ``limit``, the
    first ``limit`` of that ranking only (found without sorting every neuron)."""
    ok = allowed.ravel()
    scored = ok & ~np.isnan(values.ravel())
    # NaN (an expert neuron this category's pairs never reached) ranks last among the allowed.
    flat = np.where(scored, values.ravel(), -np.inf)
    if limit is not None and limit < int(scored.sum()):  # the first `limit` are all scored neurons
        return _first_of_stable_argsort(-flat, limit)
    order = np.argsort(-flat, kind="stable")
    return order[ok[order]][:limit]


def _first_of_stable_argsort(x: np.ndarray, k: int) -> np.ndarray:
    """``np.argsort(x, kind="stable")[:k]`` of a 1-D array without NaN, 0 < k < len(x): the values up to
    the k-th smallest (a partition, no sort), sorted stably in index order, so ties keep index order."""
    kth = np.partition(x, k - 1)[k - 1]
    candidates = np.flatnonzero(x <= kth)  # ascending indices: a stable sort of them breaks ties by index
    return candidates[np.argsort(x[candidates], kind="stable")][:k]


def select(
    scores: NeuronScores,
    n: int,
    *,
    score: str = DEFAULT_SCORE,
    rule: str = DEFAULT_RULE,
    categories: Sequence[str] | None = None,
    layers: Sequence[int] | None = None,
    bias_weight: float = DEFAULT_BIAS_WEIGHT,
    spare_active: float = DEFAULT_SPARE,
) -> Selection:
    """Choose ``n`` neurons by ``score`` with ``rule`` among the allowed neurons."""
    if rule not in RULES:
        raise SelectionError(f"unknown selection rule {rule!r}; choose one of {', '.join(RULES)}")
    cats = scores.resolve(categories)
    allowed = allowed_mask(scores, layers, spare_active)
    available = int(allowed.sum())
    if n < 1 or n > available:
        where = "these layers hold" if layers is not None else "the model has"
        spared = f", after sparing the {spare_active:g} most active of each layer" if spare_active else ""
        raise SelectionError(
            f"--n {n} is out of range: {where} {available} selectable MLP neurons "
            f"({int(allowed.any(1).sum())} layers × {scores.shape[1]}{spared}); "
            f"choose 1..{available}"
        )
    width = scores.shape[1]
    if rule == "global":
        order = list(_ranking(scores.score(score, cats, bias_weight), allowed, n))
        labels = ["pooled"] * n
    elif rule == "per-category":
        # A category's next pick comes after its ranking's taken neurons, fewer than n: its first n suffice.
        rankings = [_ranking(scores.score(score, [c], bias_weight), allowed, n) for c in cats]
        order, labels = _round_robin(rankings, cats, n)
    else:
        order = _intersection(
            [_ranking(scores.score(score, [c], bias_weight), allowed) for c in cats],
            _ranking(scores.score(score, cats, bias_weight), allowed),
            n,
        )
        labels = ["all"] * n
    neurons = tuple((int(i) // width, int(i) % width) for i in order)
    return Selection(
        neurons,
        tuple(labels),
        score,
        rule,
        tuple(cats),
        None if layers is None else tuple(sorted(set(layers))),
        bias_weight,
        spare_active,
    )


def selected_edits(scores: NeuronScores, selection: Selection, factor: float) -> tuple[NeuronScale, ...]:
    """The selection as edits: a column of a mixture-of-experts layer names its expert."""
    return tuple(
        NeuronScale(layer, neuron, factor, expert)
        for layer, expert, neuron in ((la, *scores.expert_of(la, i)) for la, i in selection.neurons)
    )


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


def category_overlap(scores: NeuronScores, selection: Selection) -> dict[str, Any]:
    """Jaccard index between the categories' top-n sets, with the selection's options."""
    n, cats = len(selection.neurons), list(selection.categories)
    tops = [
        set(
            select(
                scores,
                n,
                score=selection.score,
                rule="global",
                categories=[c],
                layers=selection.layers,
                bias_weight=selection.bias_weight,
                spare_active=selection.spare_active,
            ).neurons
        )
        for c in cats
    ]
    matrix = [[round(len(a & b) / len(a | b), 4) for b in tops] for a in tops]
    return {"categories": cats, "n": n, "score": selection.score, "jaccard": matrix}


def neuron_rows(scores: NeuronScores, selection: Selection) -> list[dict[str, Any]]:
    """One record per selected neuron: its scores (pooled over the selection's categories)."""
    cats = list(selection.categories)
    bias = scores.pooled("bias", cats)
    signed = scores.pooled("signed", cats)
    activity = scores.pooled("activation", scores.categories)
    fair = fairness_score(bias, scores.ppm, selection.bias_weight)
    rows = []
    for (layer, idx), label in zip(selection.neurons, selection.labels):
        top = max(cats, key=lambda c: np.nan_to_num(scores.bias[c][layer, idx], nan=-np.inf))
        expert, neuron = scores.expert_of(layer, idx)
        where = {"layer": layer, "neuron": neuron}
        if expert is not None:  # the one notation: L:eE:N / L:s:N (surgery.core.edits.neuron_label)
            where.update(expert=expert, label=neuron_label(layer, neuron, expert))
        rows.append(
            {
                **where,
                "bias": float(bias[layer, idx]),
                "signed": float(signed[layer, idx]),
                "ppm": float(scores.ppm[layer, idx]),
                "activation": float(activity[layer, idx]),
                "fairness": float(fair[layer, idx]),
                "chosen_for": label,
                "top_category": top,
            }
        )
    return rows
