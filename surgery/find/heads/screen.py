"""The attribution-patching screen: every head's estimated knockout effect (atp.py), ranked, and the
heads it puts forward for exact knockouts together with discovery's.

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


def candidates(screened: Sequence[dict[str, Any]], ranked: Sequence[tuple[int, int]], k: int) -> list[tuple[int, int]]:
    """The heads knocked out exactly: the screen's top ``k`` and discovery's top ``k`` (``ranked``),
    screen first, each once."""
    top = [(r["layer"], r["head"]) for r in screened[:k]]
    return list(dict.fromkeys(top + list(ranked[:k])))


def spearman(screened: Sequence[float], exact: Sequence[float]) -> float:
    """Spearman's rank correlation of screened and exact effects (NaN with fewer than 3 heads or a
    constant side)."""
    from scipy import stats

    pairs = [(a, b) for a, b in zip(screened, exact) if math.isfinite(a) and math.isfinite(b)]
    if len(pairs) < 3 or len({a for a, _ in pairs}) < 2 or len({b for _, b in pairs}) < 2:
        return float("nan")
    return float(stats.spearmanr(*zip(*pairs)).statistic)
