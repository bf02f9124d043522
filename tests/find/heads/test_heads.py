"""S/K scores, ΔS statistics, discovery, causal tests and whole-head α (run time == baked)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from surgery.bake.bake import bake
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import HeadScale, Recipe
from surgery.core.errors import SurgeryError
from surgery.find.heads.attention import surgery_attention_on
from surgery.find.heads.benchmark import load_benchmark
from surgery.find.heads.causal import (
    PairRunner,
    bootstrap_effect,
    confirmed_order,
    dose_response,
    effect,
    knockout_report,
    knockout_row,
    random_head_sets,
    single_knockouts,
)
from surgery.find.heads.discovery import discover, rank_heads
from surgery.find.heads.pairs import build_pairs
from surgery.find.heads.record import HeadsFindings
from surgery.find.heads.scores import delta, encode_pairs, option_token_ids, run_prompts, s_scores, score_binding
from surgery.model.hooks import applied
from surgery.model.loading import load_model
from tests.support.binding import CHAT, assert_batching_changes_nothing, char_model, write_small_benchmark
from tests.support.tokenizer import char_tokenizer


def test_option_token_ids_single_token_spellings():
    tok = char_tokenizer()
    ids = option_token_ids(tok)
    assert ids == {x: tuple(sorted(tok.convert_tokens_to_ids([x, x.upper()]))) for x in "abc"}


def test_s_formula():
    lp = torch.log_softmax(torch.randn(3, 20, generator=torch.Generator().manual_seed(0)), -1)
    ids = {"a": (1, 2), "b": (3,), "c": (4, 5, 6)}
    lse = lambda row, i: torch.logsumexp(row[list(i)], 0)  # noqa: E731
    for row, s in zip(lp, s_scores(lp, ids)):
        expected = lse(row, ids["c"]) - torch.logaddexp(lse(row, ids["a"]), lse(row, ids["b"]))
        assert s.item() == pytest.approx(expected.item(), abs=1e-6)


def test_delta_is_paired_t_test_over_item_means():
    rng = np.random.default_rng(0)
    items = ["x", "x", "y", "y", "y", "z", "w"]
    m, mm = rng.normal(size=7), rng.normal(size=7)
    d = delta(m, mm, items)
    names = sorted(set(items))
    im = [m[[i for i, it in enumerate(items) if it == n]].mean() for n in names]
    imm = [mm[[i for i, it in enumerate(items) if it == n]].mean() for n in names]
    ref = stats.ttest_rel(im, imm)
    assert d["delta"] == pytest.approx(m.mean() - mm.mean())
    assert (d["t"], d["p"], d["n_items"], d["n_pairs"]) == (
        pytest.approx(ref.statistic),
        pytest.approx(ref.pvalue),
        4,
        7,
    )


def test_discovery_recovers_a_planted_head():
    rng = np.random.default_rng(1)
    n_items, per_item, layers, heads = 12, 6, 4, 5
    groups = np.repeat([f"item{i}" for i in range(n_items)], per_item)
    y = np.tile([1, 0], len(groups) // 2)
    x = rng.normal(size=(len(groups), layers, heads))
    x[y == 1, 2, 3] += 2.5  # head 2.3 binds in match prompts only
    res = discover(x, y, groups)
    assert res["auc"] > 0.8 and res["folds"] == 5
    assert rank_heads(res)[0] == (2, 3) and [2, 3] in res["stable_heads"]
    assert len(res["heads"]) == layers * heads  # every head ranked
    with pytest.raises(SurgeryError, match="≥ 2 items"):
        discover(x[:per_item], y[:per_item], groups[:per_item])


def test_random_head_sets_and_effect():
    sets = random_head_sets(3, 4, 2, 20, [(0, 0), (1, 1)], seed=0)
    assert len(sets) == 20 and all(len(s) == 2 and len(set(s)) == 2 for s in sets)
    assert not any(h in s for s in sets for h in [(0, 0), (1, 1)])
    assert effect(-2.0, -1.5) == pytest.approx(25.0) and np.isnan(effect(0.0, 1.0))
    base_m, base_mm = np.array([1.0, 2, 3, 4]), np.zeros(4)
    lo, hi = bootstrap_effect(base_m, base_mm, base_m / 2, base_mm, ["a", "b", "c", "d"], n_boot=200)
    assert lo == pytest.approx(50.0) and hi == pytest.approx(50.0)  # halved everywhere: exactly 50%


# One ΔS per item (30 items), summing to 0.3: ΔS_base = 0.01, far inside its spread over items.
NEAR_ZERO = [
    0.60,
    -2.56,
    0.42,
    -0.57,
    -0.45,
    -0.22,
    -2.02,
    -0.23,
    -0.87,
    3.32,
    0.23,
    -0.35,
    -0.28,
    -0.67,
    -1.06,
    -0.39,
    0.48,
    -0.24,
    0.96,
    -0.2,
    0.02,
    1.55,
    0.55,
    -0.51,
    -0.18,
    0.54,
    1.94,
    -0.27,
    -0.24,
    1.0,
]


def test_no_ci_for_an_effect_of_a_delta_s_indistinguishable_from_zero():
    """The distractor control of the issue: a knockout that moves ΔS by 0.00122 reports −12.2 % of a
    ΔS_base of 0.01. Resamples change ΔS_base's sign, and their ratios ([−7.5, 6.8] as percentiles)
    left the estimate out: there is no CI then, and no significance."""
    base = np.r_[NEAR_ZERO, np.zeros(30)]
    row = knockout_row(base, base + np.r_[np.full(30, 0.00122), np.zeros(30)], [f"item{i}" for i in range(30)])
    assert row["delta_base"] == pytest.approx(0.01) and row["effect_pct"] == pytest.approx(-12.2)
    assert np.isnan(row["ci95"]).all()
    # the same knockout on a ΔS whose sign every resample keeps: an interval around its estimate
    shifted = np.r_[np.array(NEAR_ZERO) + 3.0, np.zeros(30)]
    row = knockout_row(shifted, shifted + np.r_[np.full(30, 0.3), np.zeros(30)], [f"item{i}" for i in range(30)])
    assert row["effect_pct"] == pytest.approx(-100 * 0.3 / 3.01)
    assert row["ci95"][0] < row["effect_pct"] < row["ci95"][1] < 0


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n_items=st.integers(2, 9), seed=st.integers(0, 3))
def test_every_reported_ci_contains_its_estimate(data, n_items, seed):
    """Whatever the S values, a knockout row's 95% CI (when it has one) holds its effect %."""
    per_item = data.draw(st.lists(st.integers(1, 4), min_size=n_items, max_size=n_items))
    items = [f"item{i}" for i, k in enumerate(per_item) for _ in range(k)]
    s = st.floats(-8, 8, allow_nan=False, allow_infinity=False)
    base = np.array(data.draw(st.lists(s, min_size=2 * len(items), max_size=2 * len(items))))
    change = data.draw(st.sampled_from(["shift", "scale", "free"]))
    if change == "shift":  # a knockout that moves every S alike (as the control's edges often do)
        knocked = base + data.draw(st.floats(-1, 1))
    elif change == "scale":
        knocked = base * data.draw(st.floats(-2, 2))
    else:
        knocked = np.array(data.draw(st.lists(s, min_size=2 * len(items), max_size=2 * len(items))))
    row = knockout_row(base, knocked, items, seed)
    lo, hi = row["ci95"]
    assert np.isnan(lo) == np.isnan(hi)
    if not np.isnan(lo):
        assert lo <= row["effect_pct"] <= hi, row


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("bind")
    bench = load_benchmark(write_small_benchmark(root / "small.jsonl"))
    return bench, build_pairs(bench, seed=0, max_pairs=4)


def test_batched_s_equals_unbatched(tiny, small):
    path = char_model(tiny, "llama", CHAT)
    model, tok = load_model(path), char_tokenizer(CHAT)
    # instruct (chat template) and base prompts of different lengths in one batch: padding varies
    prompts = encode_pairs(tok, small[1][:2], "binding", True) + encode_pairs(tok, small[1][2:3], "knowledge", False)
    assert_batching_changes_nothing(model, tok, prompts, batch_size=8, atol=1e-5)


def test_whole_head_alpha_at_run_time_equals_baked(tiny, small, tmp_path):
    path = char_model(tiny, "gemma2")
    tok = char_tokenizer()
    prompts = encode_pairs(tok, small[1][:2], "binding", False)
    ids = option_token_ids(tok)
    edits = (HeadScale(0, 1, 2.5), HeadScale(2, 3, 2.5))
    ckpt = Checkpoint(path)
    bake(ckpt, Recipe(edits), tmp_path / "baked")
    source, baked = load_model(path), load_model(tmp_path / "baked")
    with applied(source, edits):
        run_time = run_prompts(source, prompts, ids).s
    np.testing.assert_allclose(run_prompts(baked, prompts, ids).s, run_time, atol=1e-5)
    assert not np.allclose(run_prompts(source, prompts, ids).s, run_time, atol=1e-5)


def test_scores_knockout_and_dose_response_on_tiny_model(tiny, small):
    path = char_model(tiny, "qwen2")
    model, tok = load_model(path), char_tokenizer()
    pairs = small[1]
    with surgery_attention_on(model):
        res = score_binding(model, tok, pairs, instruct=False, features=True)
        assert res["features"].shape == (2 * len(pairs), 3, 4)
        assert res["S"]["n_pairs"] == len(pairs) and "p" in res["K"]
        runner = PairRunner(
            model,
            encode_pairs(tok, pairs, "binding", False),
            [p.item for p in pairs],
            option_token_ids(tok),
            base=res["s"],
        )
        heads = [(1, 0), (2, 3)]
        report = knockout_report(runner, heads, 3, 4, random_sets=1)
        dose = dose_response(runner, heads, (0.0, 1.0, 2.0))
    t = report["tested"]
    assert t["delta_base"] == pytest.approx(res["S"]["delta"])
    assert t["delta_knockout"] != t["delta_base"] and report["control"]["delta_knockout"] != t["delta_base"]
    assert t["effect_pct"] == pytest.approx(effect(t["delta_base"], t["delta_knockout"]))
    assert report["random"]["n"] == 1 and len(report["random_sets"]) == 1
    assert dose[0]["edge_delta_s"] == pytest.approx(t["delta_knockout"])  # edge α = 0 is the knockout
    one = dose[1]
    assert one["edge_delta_s"] == one["whole_delta_s"] == pytest.approx(res["S"]["delta"])
    assert dose[2]["edge_delta_s"] != dose[2]["whole_delta_s"]


def test_confirmed_order_puts_significant_reductions_first_by_effect():
    rows = [
        {"layer": 2, "head": 2, "effect_pct": 0.1, "significant": False},
        {"layer": 0, "head": 1, "effect_pct": 30.0, "significant": True},
        {"layer": 1, "head": 1, "effect_pct": float("nan"), "significant": False},
        {"layer": 0, "head": 3, "effect_pct": 55.0, "significant": True},
        {"layer": 1, "head": 0, "effect_pct": 40.0, "significant": False},
    ]  # large but CI reaches 0
    order = [(r["layer"], r["head"]) for r in confirmed_order(rows)]
    assert order == [(0, 3), (0, 1), (1, 0), (2, 2), (1, 1)]


def test_single_knockouts_are_the_runners_one_head_knockouts(tiny, small):
    path = char_model(tiny, "llama")
    model, tok = load_model(path), char_tokenizer()
    pairs = small[1]
    heads = [(0, 1), (2, 3)]
    with surgery_attention_on(model):
        runner = PairRunner(
            model, encode_pairs(tok, pairs, "binding", False), [p.item for p in pairs], option_token_ids(tok)
        )
        rows = single_knockouts(runner, heads, seed=3)
        alone = [runner.knockout([h], "tested", 3) for h in heads]
    for r, ko, h in zip(rows, alone, heads):
        assert (r["layer"], r["head"]) == h and r["effect_pct"] == ko["effect_pct"]
        np.testing.assert_equal(r["ci95"], ko["ci95"])  # NaN bounds (no CI) count as equal
        assert r["significant"] == (ko["ci95"][0] > 0)


def head_ranking(payload: dict) -> list[tuple[int, int]]:
    """The ranking of heads findings with ``payload`` (and a minimal common head)."""
    head = {"format": "surgery-findings", "version": 1, "kind": "heads", "model": {"fingerprint": "f" * 64}}
    return HeadsFindings.from_dict({**head, **payload}).ranking()


def test_head_ranking_follows_the_confirmation_when_present():
    disc = {"heads": [{"layer": 2, "head": h} for h in range(3)] + [{"layer": 0, "head": h} for h in range(3)]}
    plain = {"discovery": disc, "selected_heads": [[2, 0], [2, 1]]}
    assert head_ranking(plain)[:3] == [(2, 0), (2, 1), (2, 2)]
    conf = {"n_significant": 0, "heads": [{"layer": 0, "head": 1}, {"layer": 0, "head": 0}, {"layer": 2, "head": 0}]}
    confirmed = {"discovery": disc, "selected_heads": [[0, 1]], "confirmation": conf}
    ranking = head_ranking(confirmed)
    assert ranking[:4] == [(0, 1), (0, 0), (2, 0), (2, 1)] and len(ranking) == len(set(ranking)) == 6


def test_find_heads_says_how_much_work_it_will_do():
    """Before a long run starts: 4 scoring prompts per pair (2 more for the screen's backward), then
    2 per pair in each knockout pass (confirmations, selection, control, random sets,
    dose-response)."""
    from surgery.find.heads.params import FindParams
    from surgery.find.heads.work import work_note

    # the default is the quickstart's measured procedure: 6.3–12.4 min for 4,608 prompt passes (96
    # pairs, 10 random sets), scaled to this run's 124,032.
    assert work_note(1824, FindParams(exhaustive=True)) == (
        "1824 pairs: about 124,032 prompt passes (32 knockout passes); on 2 CPU cores a 135M "
        "model needs about 2.8–5.6 h for that (the quickstart's --max-pairs 96 --random-sets 10 "
        "took 6.3–12.4 min): use those on a CPU, or a GPU"
    )
    # the default, screened: at most discovery's top 10 knocked out alone (the screen's order stops
    # earlier), the screen's pass with gradients one pass more
    assert work_note(1824, FindParams()) == (
        f"1824 pairs: about {1824 * (6 + 2 * 32):,} prompt passes (32 knockout passes at most, the screen's "
        "backward counted as one); on 2 CPU cores a 135M model needs about 2.9–5.7 h for that (the "
        "quickstart's --max-pairs 96 --random-sets 10 took 6.3–12.4 min): use those on a "
        "CPU, or a GPU"
    )
    assert "needs about 20–39 min for that" in work_note(300, FindParams(random_sets=10, exhaustive=True))
    grid = len(set(FindParams().dose_grid) | set(FindParams().awareness_alphas)) - 1  # α = 1 is free
    note = work_note(96, FindParams(random_sets=10, confirm=0, dose_response=True, exhaustive=True))
    assert note == (
        f"96 pairs: about {4 * 96 + (12 + 2 * grid) * 2 * 96:,} prompt passes ({12 + 2 * grid} knockout passes)"
    )
    note = work_note(96, FindParams(random_sets=10, candidates=4))
    assert note == f"96 pairs: about {6 * 96 + 22 * 2 * 96:,} prompt passes (22 knockout passes at most, " + (
        "the screen's backward counted as one)"
    )
