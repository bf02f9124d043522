"""The Pareto front of a tune and the point chosen from it.

Every trial has an effect (higher is better) and a cost, the first-token KL on neutral prompts
(lower is better). The front is the set of trials no other trial beats on both. The chosen point is
the front's largest effect within a KL bound, or without one the knee: the front point nearest the
ideal corner (largest effect, smallest KL) once each objective is scaled to the front's own range,
so that neither unit decides.

The unedited model is a point of its own, effect 0 at KL 0: a trial whose effect is 0 or below is
matched or beaten by leaving the model alone, so it never enters the front (else the knee of a front
whose cheapest point does nothing could choose an edit that only costs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ...core.errors import ParameterError


@dataclass(frozen=True)
class Point:
    """One trial's objectives."""

    number: int
    effect: float
    kl: float


def dominates(a: Point, b: Point) -> bool:
    """``a`` is at least as good as ``b`` on both objectives and better on one."""
    return a.effect >= b.effect and a.kl <= b.kl and (a.effect > b.effect or a.kl < b.kl)


def pareto_front(points: Sequence[Point]) -> list[Point]:
    """The non-dominated points with an effect above 0 (the unedited model's), by KL (then effect, then
    trial number); of equal points the first trial."""
    finite = [p for p in points if math.isfinite(p.effect) and math.isfinite(p.kl)]
    front, seen = [], set()
    for p in sorted((p for p in finite if p.effect > 0), key=lambda p: (p.kl, -p.effect, p.number)):
        if (p.effect, p.kl) in seen or any(dominates(q, p) for q in finite):
            continue
        seen.add((p.effect, p.kl))
        front.append(p)
    return front


def knee(front: Sequence[Point]) -> Point:
    """The front point nearest the ideal corner, each objective scaled to the front's range."""
    lo_e, hi_e = min(p.effect for p in front), max(p.effect for p in front)
    lo_k, hi_k = min(p.kl for p in front), max(p.kl for p in front)

    def distance(p: Point) -> float:
        e = (hi_e - p.effect) / (hi_e - lo_e) if hi_e > lo_e else 0.0
        k = (p.kl - lo_k) / (hi_k - lo_k) if hi_k > lo_k else 0.0
        return math.hypot(e, k)

    return min(front, key=lambda p: (distance(p), p.number))


def choose(front: Sequence[Point], max_kl: float | None, points: Sequence[Point] = ()) -> tuple[Point, str]:
    """The chosen point and the rule that chose it (``"max_kl"`` or ``"knee"``); a bound no point
    meets is a one-line error naming the smallest KL reached, an empty front one naming the largest
    effect of ``points`` (the trials)."""
    if not front:
        finite = [p for p in points if math.isfinite(p.effect) and math.isfinite(p.kl)]
        if not finite:
            raise ParameterError("no trial finished with finite objectives; nothing to choose from")
        best = max(finite, key=lambda p: (p.effect, -p.kl))
        raise ParameterError(
            f"no trial had an effect above 0, the unedited model's (the largest: {best.effect:+.4g}, trial "
            f"{best.number}): every edit tried did no better than none; run more {{trials}} or widen the search",
            "trials",
        )
    if max_kl is None:
        return knee(front), "knee"
    within = [p for p in front if p.kl <= max_kl]
    if not within:
        least = min(front, key=lambda p: p.kl)
        raise ParameterError(
            f"no trial with an effect kept first-token KL within {{max_kl}} {max_kl:g}: the smallest KL reached was "
            f"{least.kl:.4g} (trial {least.number}); raise {{max_kl}} or widen the search",
            "max_kl",
        )
    return max(within, key=lambda p: (p.effect, -p.kl, -p.number)), "max_kl"
