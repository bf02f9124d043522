"""What a quoted heads finding cannot claim: the caveats that travel with its numbers, wherever they
are shown (find-heads' tables through the library's records, a baked checkpoint's model card); and
the one of a tuned edit whose held-out effect is not shown above 0.

It lives below the finder that makes the numbers and the bake whose card quotes them, so that
neither imports the other."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

SIGNIFICANT = 0.05  # the level below which ΔS counts as an effect the knockout can reduce


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def delta_s_caveat(p: float | None) -> str | None:
    """The caveat for a ΔS whose paired t-test gave ``p`` (None when ΔS is significant)."""
    if _finite(p) and p < SIGNIFICANT:
        return None
    shown = f"{p:.3f}" if _finite(p) else "undefined"
    return (
        f"ΔS itself is not significant (p = {shown}): the knockout % divides by a ΔS indistinguishable "
        "from 0, so it and its CI are not interpretable"
    )


def knockout_caveat(ci95: Sequence[float | None] | None) -> str | None:
    """The caveat for a knockout reduction with 95% CI ``ci95`` (None when the CI lies above 0)."""
    lo, hi = (list(ci95) + [None, None])[:2] if ci95 else (None, None)
    if _finite(lo) and _finite(hi):
        if lo > 0:
            return None
        return f"the knockout reduction is not significant (its 95% CI [{lo:.1f}, {hi:.1f}] % includes 0)"
    return "the knockout reduction has no 95% CI (ΔS changes sign across the bootstrap), so it is not significant"


def weak_heads_caveat(weak: int | None, selected: int) -> str | None:
    """The caveat for ``weak`` of the ``selected`` heads without a significant single-head knockout."""
    if not weak:
        return None
    return (
        f"{weak} of the {selected} selected heads have no significant single-head knockout effect (95% CI not above 0)"
    )


def caveats(summary: Mapping[str, Any]) -> list[str]:
    """The caveats of a heads findings summary (surgery.find.heads.find.summary) for what it quotes:
    ΔS (``p_s``), the knockout reduction (``knockout_ci95``), the selected heads (``weak_heads``)."""
    found = []
    if "p_s" in summary:
        found.append(delta_s_caveat(summary["p_s"]))
    if "knockout_effect_pct" in summary or "knockout_ci95" in summary:
        found.append(knockout_caveat(summary.get("knockout_ci95")))
    if summary.get("weak_heads"):
        found.append(weak_heads_caveat(summary["weak_heads"], len(summary.get("selected_heads") or [])))
    return [c for c in found if c]


def held_out_caveat(summary: Mapping[str, Any]) -> tuple[Any, Any, Any] | None:
    """(effect, CI low, CI high) of a tune summary's held-out confirmation (a bake's ``extra["tune"]``)
    whose 95% CI does not lie above 0 (a missing bound counts as not above), or None."""
    confirmation = summary.get("confirmation") or {}
    ci = confirmation.get("effect_ci95")
    if not ci:
        return None
    low, high = ci
    if _finite(low) and low > 0:
        return None
    return confirmation.get("effect"), low, high
