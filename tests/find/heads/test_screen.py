"""The screen's ranking (screen.py): estimated effects by the exact knockouts' formula, the heads put
forward, the rank correlation with the exact effects."""

from __future__ import annotations

import math

import numpy as np
import pytest

from surgery.find.heads.causal import effect
from surgery.find.heads.screen import candidates, screen_heads, spearman


def test_screened_effects_follow_the_knockout_formula():
    """A head's estimated S_ko is S + ∂S/∂e; ΔS and effect % as for an exact knockout; largest first."""
    s = np.array([-1.0, -2.0, 0.5, 0.5])  # 2 pairs: match, match, mismatch, mismatch
    attribution = np.zeros((4, 2, 2))
    attribution[:2, 1, 0] = 1.0  # removes 1 of ΔS = −2: 50 %
    attribution[:2, 0, 1] = -0.5  # adds to |ΔS|: −25 %
    rows = screen_heads(s, attribution, [3, 5], n=2)  # feature layers 0, 1 are model layers 3, 5
    assert [(r["layer"], r["head"]) for r in rows][:1] == [(5, 0)] and (3, 1) == (rows[-1]["layer"], rows[-1]["head"])
    assert rows[0]["delta_knockout"] == pytest.approx(-1.0) and rows[0]["effect_pct"] == pytest.approx(50.0)
    assert rows[-1]["effect_pct"] == pytest.approx(effect(-2.0, -2.5))
    assert len(rows) == 4 and rows[1]["effect_pct"] == rows[2]["effect_pct"] == 0.0


def test_the_heads_put_forward_are_both_tops_once_screen_first():
    screened = [{"layer": 0, "head": 3}, {"layer": 1, "head": 0}, {"layer": 2, "head": 2}]
    ranked = [(2, 2), (1, 1), (0, 0)]
    assert candidates(screened, ranked, 2) == [(0, 3), (1, 0), (2, 2), (1, 1)]
    assert candidates(screened, ranked, 3) == [(0, 3), (1, 0), (2, 2), (1, 1), (0, 0)]


def test_spearman_of_screened_and_exact_effects():
    assert spearman([1.0, 2.0, 3.0, 4.0], [10.0, 30.0, 20.0, 40.0]) == pytest.approx(0.8)
    assert spearman([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert spearman([1.0, float("nan"), 3.0, 4.0], [1.0, 2.0, 3.0, 5.0]) == pytest.approx(1.0)  # NaN left out
    assert math.isnan(spearman([1.0, 2.0], [1.0, 2.0]))  # too few heads
    assert math.isnan(spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))  # a constant side
