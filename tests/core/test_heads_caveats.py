"""The caveats a heads finding's numbers carry wherever they are shown (surgery/core/heads_caveats.py)."""

from __future__ import annotations

from surgery.core.heads_caveats import caveats


def test_caveats_only_for_what_is_not_significant():
    strong = {
        "p_s": 0.001,
        "knockout_effect_pct": 14.0,
        "knockout_ci95": [9.0, 19.5],
        "weak_heads": 0,
        "selected_heads": [[7, 7]],
    }
    assert caveats(strong) == [] and caveats({"kind": "neurons", "n": 40}) == []
    weak = caveats({**strong, "p_s": float("nan"), "knockout_ci95": [float("nan"), float("nan")]})
    assert [c.split(" (")[0] for c in weak] == ["ΔS itself is not significant", "the knockout reduction has no 95% CI"]
