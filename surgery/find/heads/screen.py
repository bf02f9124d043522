"""The attribution-patching screen: every head's estimated knockout effect (atp.py), ranked, and the
order in which the exhaustive procedure's candidates (discovery's top ``--confirm``) are knocked out
exactly: the screen's top few first, then any other that its error leaves a chance to be selected.

Each head's estimated knocked-out S is ``S + ∂S/∂e`` per prompt; ΔS and the effect % follow as for
the exact knockouts (causal.effect), without a bootstrap: the screen ranks, the exact knockouts test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .causal import effect


def screen_heads(s: np.ndarray, attribution: np.ndarray, layers: Sequence[int], n: int) -> list[dict[str, Any]]:
    """Every head's screened knockout, largest estimated reduction of ΔS first.

    ``s``: the 2·n prompts' S (match, then mismatch); ``attribution``: their (2·n, layers, heads)
    ∂S/∂e. Each head's estimated knocked-out S is ``s + ∂S/∂e``; ΔS and effect % as causal.knockout_row
    computes them (means over pairs), without a bootstrap: the screen ranks, the exact knockouts test.
    """
    base = float(s[:n].mean() - s[n:].mean())
    rows = []
    for i, layer in enumerate(layers):
        for head in range(attribution.shape[2]):
            ko = s + attribution[:, i, head]
            delta = float(ko[:n].mean() - ko[n:].mean())
            rows.append({"layer": int(layer), "head": head, "delta_knockout": delta, "effect_pct": effect(base, delta)})
    return sorted(rows, key=lambda r: -r["effect_pct"] if math.isfinite(r["effect_pct"]) else math.inf)


def screen_record(rows: Sequence[dict[str, Any]], base: float, top: int) -> dict[str, Any]:
    """The findings' ``screen``: the method, ΔS without knockout, and every head's estimate (ranked)."""
    return {
        "method": "attribution patching (AtP*): S + Σ (P_ko − P)·∂S/∂P, exact knocked-out pattern",
        "delta_base": base,
        "put_forward": top,
        "heads": list(rows),
    }


def pool_order(screened: Sequence[dict[str, Any]], pool: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The heads of ``pool`` (the exhaustive procedure's candidates: discovery's top ``--confirm``) in
    the screen's order (``screened``: every head's row, ranked), largest estimated effect first."""
    rank = {(r["layer"], r["head"]): i for i, r in enumerate(screened)}
    return sorted(pool, key=lambda h: rank[tuple(h)])


def still_open(
    screened: Sequence[dict[str, Any]], order: Sequence[tuple[int, int]], exact: Sequence[dict[str, Any]], k: int
) -> list[tuple[int, int]]:
    """The heads of ``order`` (the pool in the screen's order) not knocked out yet that could still
    enter the selection: those whose screened effect plus the screen's largest error on the heads
    knocked out (``exact``: their rows, in confirmed order) reaches the weakest exact effect of the
    selection (the first ``k``). All of them where that comparison is undefined (NaN effects)."""
    estimate = {(r["layer"], r["head"]): r["effect_pct"] for r in screened}
    done = {(r["layer"], r["head"]) for r in exact}
    left = [h for h in order if tuple(h) not in done]
    errors = [abs(estimate[(r["layer"], r["head"])] - r["effect_pct"]) for r in exact]
    weakest = min((r["effect_pct"] for r in exact[:k]), default=math.nan)
    if len(exact) < k or not all(math.isfinite(e) for e in errors) or not math.isfinite(weakest):
        return left
    error = max(errors)
    return [h for h in left if not math.isfinite(estimate[tuple(h)]) or estimate[tuple(h)] + error >= weakest]


def beyond_pool(
    screened: Sequence[dict[str, Any]], pool: Sequence[tuple[int, int]], weakest: float
) -> list[dict[str, Any]]:
    """Heads outside ``pool`` whose screened effect exceeds ``weakest`` (the selection's weakest exact
    effect): what the screen suggests beyond discovery's candidates (a note, never the selection)."""
    inside = {tuple(h) for h in pool}
    if not math.isfinite(weakest):
        return []
    return [
        dict(r)
        for r in screened
        if (r["layer"], r["head"]) not in inside and math.isfinite(r["effect_pct"]) and r["effect_pct"] > weakest
    ]


def spearman(screened: Sequence[float], exact: Sequence[float]) -> float:
    """Spearman's rank correlation of screened and exact effects (NaN with fewer than 3 heads or a
    constant side)."""
    from scipy import stats

    pairs = [(a, b) for a, b in zip(screened, exact) if math.isfinite(a) and math.isfinite(b)]
    if len(pairs) < 3 or len({a for a, _ in pairs}) < 2 or len({b for _, b in pairs}) < 2:
        return float("nan")
    return float(stats.spearmanr(*zip(*pairs)).statistic)
