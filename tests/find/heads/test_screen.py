"""The screen's ranking (screen.py): estimated effects by the exact knockouts' formula, the heads put
forward, the rank correlation with the exact effects."""

from __future__ import annotations

import math

import numpy as np
import pytest

from surgery.find.heads.causal import effect
from surgery.find.heads.screen import beyond_pool, pool_order, screen_heads, spearman, still_open


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


def _rows(effects: dict[tuple[int, int], float]) -> list[dict]:
    rows = [{"layer": h[0], "head": h[1], "effect_pct": e} for h, e in effects.items()]
    return sorted(rows, key=lambda r: -r["effect_pct"])


def test_the_pool_is_knocked_out_in_the_screens_order():
    screened = _rows({(0, 3): 9.0, (1, 0): 7.0, (2, 2): 5.0, (1, 1): 3.0, (0, 0): 1.0})
    assert pool_order(screened, [(0, 0), (2, 2), (1, 1), (0, 3)]) == [(0, 3), (2, 2), (1, 1), (0, 0)]


def test_a_head_stays_open_while_the_screens_error_leaves_it_a_chance():
    """The selection's weakest exact effect (the k-th in confirmed order) against each remaining
    head's screened effect plus the screen's largest error on the heads knocked out."""
    screened = _rows({(0, 0): 10.0, (0, 1): 8.0, (0, 2): 6.0, (0, 3): 4.0, (0, 4): 1.0})
    order = [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4)]
    exact = [
        {"layer": 0, "head": 0, "effect_pct": 11.0},
        {"layer": 0, "head": 1, "effect_pct": 7.0},
        {"layer": 0, "head": 2, "effect_pct": 5.5},  # weakest 5.5; largest error |8 − 7| = 1
    ]
    assert still_open(screened, order, exact, 3) == []  # 4 + 1 < 5.5
    exact[2]["effect_pct"] = 4.5  # error 1.5: 4 + 1.5 ≥ 4.5, 1 + 1.5 < 4.5
    assert still_open(screened, order, exact, 3) == [(0, 3)]
    assert still_open(screened, order, exact[:2], 3) == [(0, 2), (0, 3), (0, 4)]  # fewer than k knocked out
    exact[0]["effect_pct"] = math.nan  # an undefined comparison: every head stays open
    assert still_open(screened, order, exact, 3) == [(0, 3), (0, 4)]


def test_heads_beyond_the_pool_are_those_the_screen_puts_above_the_selection():
    screened = _rows({(0, 0): 10.0, (0, 1): 8.0, (0, 2): 6.0, (0, 3): math.nan})
    beyond = beyond_pool(screened, [(0, 1), (0, 2)], 7.0)
    assert [(r["layer"], r["head"]) for r in beyond] == [(0, 0)]
    assert beyond_pool(screened, [(0, 1)], math.nan) == []


def test_spearman_of_screened_and_exact_effects():
    assert spearman([1.0, 2.0, 3.0, 4.0], [10.0, 30.0, 20.0, 40.0]) == pytest.approx(0.8)
    assert spearman([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert spearman([1.0, float("nan"), 3.0, 4.0], [1.0, 2.0, 3.0, 5.0]) == pytest.approx(1.0)  # NaN left out
    assert math.isnan(spearman([1.0, 2.0], [1.0, 2.0]))  # too few heads
    assert math.isnan(spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))  # a constant side
