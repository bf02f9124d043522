"""The random-set baseline as a sequential Monte-Carlo test (baseline.py, Besag & Clifford 1991):
its stopping count, p-values and validity, and the knockout report that stops early."""

from __future__ import annotations

import math

import numpy as np
import pytest

from surgery.find.heads.attention import surgery_attention_on
from surgery.find.heads.baseline import Sequential, unreachable_note
from surgery.find.heads.benchmark import load_benchmark
from surgery.find.heads.causal import PairRunner, knockout_edit, knockout_report, knockout_sets
from surgery.find.heads.pairs import build_pairs
from surgery.find.heads.scores import encode_pairs, option_token_ids
from surgery.model.loading import load_model
from tests.support.binding import CHAT, char_model, write_small_benchmark
from tests.support.tokenizer import char_tokenizer


@pytest.mark.parametrize(
    "cap, level, h, reachable, first",
    [
        (10, 0.05, 1, False, 3),  # the quickstart's cap: p ≥ 1/11 > 0.05
        (19, 0.05, 1, True, 5),  # the least cap that can reach 0.05
        (20, 0.05, 1, True, 5),
        (99, 0.05, 5, True, 25),  # (k + 1)/100 > 0.05 from k = 5 on
        (4, 0.5, 2, True, 2),
    ],
)
def test_the_stopping_count_is_where_the_level_goes_out_of_reach(cap, level, h, reachable, first):
    rule = Sequential(cap, level)
    assert (rule.stop_after, rule.reachable, rule.first_chunk()) == (h, reachable, first)
    # h exceedances put p ≤ level out of reach at the cap; h − 1 do not (where reachable)
    assert (h + 1) / (cap + 1) > level and (not reachable or h / (cap + 1) <= level)


def test_p_values_stopped_at_the_cap_and_without_stopping():
    rule = Sequential(19, 0.05)
    stopped = rule.summary([1.0, 5.0, 10.0], tested=4.0)  # the 2nd set beats the selection: h = 1
    assert (stopped["n"], stopped["p"], stopped["share_ge_tested"]) == (2, 0.5, 0.5)
    assert stopped["stopped"] == "1 set at least as effective"
    capped = rule.summary([1.0] * 19, tested=4.0)
    assert (capped["n"], capped["p"], capped["stopped"]) == (19, 1 / 20, "cap")
    every = Sequential(10).summary([1.0, 5.0, 6.0] + [0.0] * 7, tested=4.0)  # --exhaustive: no stopping
    assert (every["n"], every["p"], every["stopped"], every["stop_after"]) == (10, 3 / 11, "all sets", None)
    nan = rule.summary([1.0, 2.0], tested=float("nan"))  # ΔS_base = 0: nothing to beat
    assert nan["n"] == 1 and nan["p"] == 1.0


def test_the_sequential_p_value_is_valid_under_the_null():
    """Selection and random sets exchangeable (no effect): P(p ≤ level) ≤ level, for caps that reach
    the level, over many simulated runs; and the sets spent are far fewer than the cap."""
    rng = np.random.default_rng(1)
    for cap, level in ((19, 0.05), (39, 0.1)):
        rule = Sequential(cap, level)
        runs = [rule.summary(list(x[1:]), x[0]) for x in rng.normal(size=(5000, cap + 1))]
        rejected = np.mean([r["p"] <= level for r in runs])
        assert rejected <= level + 3 * math.sqrt(level * (1 - level) / len(runs)), (cap, rejected)
        assert np.mean([r["n"] for r in runs]) < cap / 2


def test_an_unreachable_level_is_said_with_the_cap_that_reaches_it():
    assert unreachable_note(10, 0.05) == (
        "with --random-sets 10 the random-set baseline's smallest p is 1/11 = 0.091 > level 0.05: it cannot "
        "show the heads beat random heads at that level; use --random-sets 19 or more"
    )


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("bind")
    return build_pairs(load_benchmark(write_small_benchmark(root / "small.jsonl")), seed=0, max_pairs=4)


@pytest.mark.parametrize("level, early", [(0.5, False), (0.2, True)])
def test_the_knockout_report_stops_early_on_the_exhaustive_sets(tiny, small, level, early):
    """The stopped report's random sets are the first of the exhaustive report's, with the same effects,
    as many as the rule says for those effects; the sets it did not need cost no FLOPs."""
    path = char_model(tiny, "llama", CHAT)
    model, tok = load_model(path), char_tokenizer(CHAT)
    prompts, items, ids = encode_pairs(tok, small, "binding", True), [p.item for p in small], option_token_ids(tok)
    heads, cap = [(2, 0)], 8
    reports, spent = [], []
    with surgery_attention_on(model):
        for rule_level in (None, level):
            runner = PairRunner(model, prompts, items, ids, batch_size=3)
            assert len(runner.base) == len(prompts)  # its own baseline pass, outside the counted sweeps
            flops = runner.counter.flops
            reports.append(knockout_report(runner, heads, 3, 4, random_sets=cap, seed=1, level=rule_level))
            spent.append(runner.counter.flops - flops)
    every, stopped = reports
    effects = [r["effect_pct"] for r in every["random_sets"]]
    at = Sequential(cap, level).stopped_at(effects, every["tested"]["effect_pct"])
    assert every["random"]["n"] == cap and stopped["random"]["n"] == (at or cap)
    np.testing.assert_equal(stopped["random_sets"], every["random_sets"][: stopped["random"]["n"]])
    np.testing.assert_equal((stopped["tested"], stopped["control"]), (every["tested"], every["control"]))
    # one sweep of the first chunk, when that decides; both sweeps' baselines otherwise
    first = Sequential(cap, level).first_chunk()
    assert (at is not None and at <= first) == early  # h = 4 (level 0.5) needs both sweeps; h = 1 stops in the first
    assert (spent[1] < spent[0]) == early


@pytest.mark.parametrize("level", [0.5, 0.2])
def test_with_every_baseline_pass_kept_the_sets_run_one_at_a_time(tiny, small, level):
    """A runner that keeps every batch's baseline pass runs the random sets one at a time: the same
    report as the exhaustive one's first sets, and no set after the stop (nor a baseline pass) is paid."""
    path = char_model(tiny, "llama", CHAT)
    model, tok = load_model(path), char_tokenizer(CHAT)
    prompts, items, ids = encode_pairs(tok, small, "binding", True), [p.item for p in small], option_token_ids(tok)
    heads, cap = [(2, 0)], 8
    with surgery_attention_on(model):
        every = knockout_report(PairRunner(model, prompts, items, ids, batch_size=3), heads, 3, 4, random_sets=cap)
        runner = PairRunner(model, prompts, items, ids, batch_size=3)
        runner.sweep([knockout_edit([(1, 1)])])  # keeps every batch's baseline pass
        assert runner.holds_all()
        flops = runner.counter.flops
        stopped = knockout_report(runner, heads, 3, 4, random_sets=cap, level=level)
        spent = runner.counter.flops - flops
    effects = [r["effect_pct"] for r in every["random_sets"]]
    n = Sequential(cap, level).stopped_at(effects, every["tested"]["effect_pct"]) or cap
    assert stopped["random"]["n"] == n
    np.testing.assert_equal(stopped["random_sets"], every["random_sets"][:n])
    np.testing.assert_equal((stopped["tested"], stopped["control"]), (every["tested"], every["control"]))
    sets = knockout_sets(heads, 3, 4, cap, seed=0)[: 2 + n]
    alone = PairRunner(model, prompts, items, ids, batch_size=3)
    with surgery_attention_on(model):
        alone.sweep([knockout_edit([(1, 1)])])
        flops = alone.counter.flops
        alone.sweep([knockout_edit(h, q) for h, q in sets])
    assert spent == alone.counter.flops - flops  # exactly the sets run, no baseline pass
