"""Knockout passes resumed from cached layer inputs (resume.py): the full passes' S and findings,
for fewer FLOPs — on tiny models of every architecture and on the planted fixtures."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from surgery.core.edits import HeadScale
from surgery.find.heads import causal
from surgery.find.heads.attention import EdgeEdit, edge_heads, surgery_attention_on
from surgery.find.heads.benchmark import load_benchmark
from surgery.find.heads.causal import (
    PairRunner,
    dose_conditions,
    dose_response,
    knockout_edit,
    knockout_report,
    knockout_sets,
    random_head_sets,
)
from surgery.find.heads.find import find_heads
from surgery.find.heads.pairs import build_pairs
from surgery.find.heads.params import FindParams
from surgery.find.heads.scores import encode_pairs, option_token_ids, run_prompts
from surgery.model.hooks import applied
from surgery.model.loading import load_model, load_tokenizer
from tests.support.binding import CHAT, char_model, write_small_benchmark
from tests.support.paths import FIXTURES
from tests.support.tokenizer import char_tokenizer

ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "gemma3", "phi3", "olmo2"]
SAME = 1e-5  # S agreement of a resumed pass with a full pass (fp32 summation order only)


def edits_for(n_layers: int, n_heads: int) -> list[EdgeEdit]:
    """Single heads in the first and last layer, random head sets, the control span, an α ≠ 0."""
    sets = random_head_sets(n_layers, n_heads, 2, 3, [], seed=1)
    return (
        [EdgeEdit(edge_heads([(0, 1)]), 0.0), EdgeEdit(edge_heads([(n_layers - 1, 2)]), 0.0)]
        + [EdgeEdit(edge_heads(s), 0.0) for s in sets]
        + [EdgeEdit(edge_heads(sets[0]), 0.0, queries="control"), EdgeEdit(edge_heads(sets[1]), 2.0)]
    )


def full_pass_scores(runner: PairRunner, edits) -> list[np.ndarray]:
    """What find-heads computed before resumed passes: every edit from the embeddings."""
    return [
        run_prompts(runner.model, runner.prompts, runner.ids, batch_size=runner.batch_size, edit=e).s for e in edits
    ]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("bind")
    return build_pairs(load_benchmark(write_small_benchmark(root / "small.jsonl")), seed=0, max_pairs=4)


@pytest.mark.parametrize("arch", ARCHS)
def test_resumed_passes_equal_full_passes(tiny, small, arch):
    path = char_model(tiny, arch, CHAT)  # chat prompts: a long shared prefix before the identities
    model, tok = load_model(path), char_tokenizer(CHAT)
    cfg = model.config.get_text_config()
    edits = edits_for(cfg.num_hidden_layers, cfg.num_attention_heads)
    with surgery_attention_on(model):
        runner = PairRunner(
            model,
            encode_pairs(tok, small, "binding", True),
            [p.item for p in small],
            option_token_ids(tok),
            batch_size=3,
        )
        swept, full = runner.sweep(edits), full_pass_scores(runner, edits)
    for s, f in zip(swept, full):
        np.testing.assert_allclose(s, f, atol=SAME, rtol=0)
    # the edits do change S, unless every layer has an 8-token window (the item is out of reach)
    windowed = getattr(cfg, "sliding_window", None) and all(
        t == "sliding_attention" for t in getattr(cfg, "layer_types", None) or ["sliding_attention"]
    )
    assert any(not np.allclose(f, runner.base, atol=1e-4) for f in full) != bool(windowed)
    assert runner.counter.flops < runner.full_flops + runner.counter.full(runner.prompts, 3)


def scales_for(n_layers: int, n_heads: int) -> list[tuple[HeadScale, ...]]:
    """Whole-head α: one head in the first and in the last layer, random sets, α = 0 and α > 1."""
    sets = random_head_sets(n_layers, n_heads, 2, 2, [], seed=2)
    return [(HeadScale(0, 1, 2.5),), (HeadScale(n_layers - 1, 2, 0.0),)] + [
        tuple(HeadScale(layer, h, a) for layer, h in s) for s, a in zip(sets, (0.0, 3.0))
    ]


def full_scaled_scores(runner: PairRunner, scales) -> list[np.ndarray]:
    """Whole-head α as dose_response ran it before: a full pass with the heads scaled."""
    out = []
    for sc in scales:
        with applied(runner.model, sc):
            out.append(
                run_prompts(
                    runner.model, runner.prompts, runner.ids, batch_size=runner.batch_size, share_prefixes=False
                ).s
            )  # the sweeps' layout: bit for bit
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_resumed_whole_head_scales_equal_full_passes(tiny, small, arch):
    """Whole-head α resumed from the lowest scaled layer's recorded inputs, in one sweep with edge
    edits: the full passes' S bit for bit, fewer FLOPs than full passes."""
    path = char_model(tiny, arch, CHAT)
    model, tok = load_model(path), char_tokenizer(CHAT)
    cfg = model.config.get_text_config()
    scales = scales_for(cfg.num_hidden_layers, cfg.num_attention_heads)
    edits = edits_for(cfg.num_hidden_layers, cfg.num_attention_heads)[:2]
    with surgery_attention_on(model):
        runner = PairRunner(
            model,
            encode_pairs(tok, small, "binding", True),
            [p.item for p in small],
            option_token_ids(tok),
            batch_size=3,
        )
        flops = runner.counter.flops
        swept = runner.sweep([*edits, *scales])
        spent = runner.counter.flops - flops
        full = full_pass_scores(runner, edits) + full_scaled_scores(runner, scales)
    for s, f in zip(swept[: len(edits)], full):
        np.testing.assert_allclose(s, f, atol=SAME, rtol=0)
    for s, f in zip(swept[len(edits) :], full[len(edits) :]):
        # the layers that run get the inputs a full pass gives them, in the same shapes: bit for bit
        np.testing.assert_array_equal(s, f)
    assert any(not np.allclose(f, runner.base, atol=1e-4) for f in full[len(edits) :])  # the scales do change S
    # the whole-head passes skip the layers below their lowest head (the first starts in layer 0)
    assert spent < (1 + len(edits) + len(scales)) * runner.counter.full(runner.prompts, 3)


def test_dose_response_equals_full_whole_head_passes(tiny, small):
    """dose_response's rows are those of edge edits and whole-head α run as full passes."""
    path = char_model(tiny, "llama", CHAT)
    model, tok = load_model(path), char_tokenizer(CHAT)
    heads, grid = [(1, 0), (2, 3)], (0.0, 1.0, 2.5)
    with surgery_attention_on(model):
        runner = PairRunner(
            model,
            encode_pairs(tok, small, "binding", True),
            [p.item for p in small],
            option_token_ids(tok),
            batch_size=3,
        )
        rows = dose_response(runner, heads, grid)
        edge = full_pass_scores(runner, [EdgeEdit(edge_heads(heads), a) for a in grid])
        whole = full_scaled_scores(runner, [tuple(HeadScale(la, h, a) for la, h in heads) for a in grid])
    assert [r["alpha"] for r in rows] == list(grid)
    for row, e, w in zip(rows, edge, whole):
        assert row["edge_delta_s"] == pytest.approx(runner.delta(e)["delta"], abs=SAME)
        assert row["whole_delta_s"] == pytest.approx(runner.delta(w)["delta"], abs=SAME)
    assert not np.allclose(whole[0], runner.base, atol=1e-4)  # α = 0 removes the heads: S moves


def test_knockouts_and_dose_response_share_one_sweep(tiny, small):
    """Prefetched together (as find_heads does with --dose-response), the knockout report and the
    dose-response are those of separate sweeps, for one baseline pass less; with the baseline passes
    kept between sweeps (the default), separate sweeps cost no more; the full-pass count is that of
    every condition asked for."""
    path = char_model(tiny, "qwen2", CHAT)
    model, tok = load_model(path), char_tokenizer(CHAT)
    heads, grid = [(1, 0), (2, 3)], (0.0, 1.0, 2.0)
    prompts = encode_pairs(tok, small, "binding", True)
    out = []
    with surgery_attention_on(model):
        for together, keep in ((False, 0), (True, 0), (False, causal.KEEP_BYTES)):
            runner = PairRunner(
                model, prompts, [p.item for p in small], option_token_ids(tok), batch_size=3, keep_bytes=keep
            )
            flops = runner.counter.flops
            if together:
                runner.prefetch(
                    [knockout_edit(h, q) for h, q in knockout_sets(heads, 3, 4, 3, seed=0)]
                    + dose_conditions(heads, grid)
                )
            report = knockout_report(runner, heads, 3, 4, random_sets=3, seed=0)
            out.append((report, dose_response(runner, heads, grid), runner.counter.flops - flops, runner.full_flops))
    (ko_a, dose_a, flops_a, full_a), (ko_b, dose_b, flops_b, full_b), (ko_c, dose_c, flops_c, full_c) = out
    # the same conditions on the same baseline: bit for bit (NaN, a CI the data do not give, equal to NaN)
    np.testing.assert_equal((ko_a, dose_a), (ko_b, dose_b))
    np.testing.assert_equal((ko_a, dose_a), (ko_c, dose_c))
    full = runner.counter.full(prompts, 3)
    assert flops_a - flops_b == full  # the dose-response's α = 0 edge edit is the knockout: swept once
    assert flops_c == flops_b  # the second sweep read the first one's baseline passes
    # as full passes: 2 + 3 knockouts, 2 edge-level and 2 whole-head α; the baseline S come from the
    # first sweep's own baseline passes (no full pass of their own)
    assert full_a == full_b == full_c == (5 + 4) * full


def test_knockouts_resume_from_the_scoring_pass(tiny, small):
    """The scoring pass's recorded baseline passes (run_prompts' ``keep``) serve the knockouts: the same
    S bit for bit as a runner's own baseline passes, and one full pass fewer; the screened scoring
    pass's S and features are the plain pass's."""
    path = char_model(tiny, "llama", CHAT)
    model, tok = load_model(path), char_tokenizer(CHAT)
    prompts, ids, items = encode_pairs(tok, small, "binding", True), option_token_ids(tok), [p.item for p in small]
    edits = [knockout_edit(h, q) for h, q in knockout_sets([(1, 0), (2, 3)], 3, 4, 2, seed=0)]
    with surgery_attention_on(model):
        own = PairRunner(model, prompts, items, ids, batch_size=3)
        kept = PairRunner(model, prompts, items, ids, batch_size=3)
        plain = run_prompts(model, prompts, ids, batch_size=3, features=True)
        scored = run_prompts(model, prompts, ids, batch_size=3, features=True, screen=True, keep=kept.keep)
        kept.base = scored.s
        np.testing.assert_array_equal(scored.s, plain.s)
        np.testing.assert_array_equal(scored.features, plain.features)
        np.testing.assert_array_equal(own.sweep(edits), kept.sweep(edits))
        np.testing.assert_array_equal(own.base, kept.base)
    assert len(kept.kept) == len(own.kept) > 0
    assert own.counter.flops - kept.counter.flops == own.counter.full(prompts, 3)


def test_counter_prices_a_resumed_edge_edit_as_the_sweep_counts_it(tiny, small):
    """Counter.resumed (the per-phase split of examples/bench_screening.py) is what a sweep that
    changes every batch adds up, for random head sets and the control span."""
    path = char_model(tiny, "llama", CHAT)
    model, tok = load_model(path), char_tokenizer(CHAT)
    prompts = encode_pairs(tok, small, "binding", True)
    with surgery_attention_on(model):
        runner = PairRunner(model, prompts, [p.item for p in small], option_token_ids(tok), batch_size=3)
        runner.sweep([knockout_edit([(0, 0)])])  # runs the baseline passes, and keeps them
        sets = random_head_sets(3, 4, 2, 3, [], seed=1)
        for heads, span in [(h, "tested") for h in sets] + [(sets[0], "control")]:
            before = runner.counter.flops
            (s,) = runner.sweep([knockout_edit(heads, span)])
            assert not np.array_equal(s, runner.base)
            assert runner.counter.flops - before == runner.counter.resumed(prompts, 3, span, min(heads)[0])


def _planted_findings(fixture, monkeypatch, full: bool) -> dict:
    if full:  # the old way: each knockout pass from the embeddings
        monkeypatch.setattr(causal.PairRunner, "sweep", full_pass_scores)
    # the exhaustive procedure: every candidate and every random set knocked out
    params = FindParams(benchmark=str(fixture / "benchmark.jsonl"), random_sets=10, batch_size=64, exhaustive=True)
    pairs = build_pairs(load_benchmark(fixture / "benchmark.jsonl"), seed=0)
    out = find_heads(fixture, pairs, params, report=lambda m: None).to_dict()
    monkeypatch.undo()
    return out


def _numbers(x, path=""):
    """Every number of a findings dict, by its path."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _numbers(v, f"{path}[{i}]")
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield path, float(x)


@pytest.mark.slow(minutes=3)
@pytest.mark.parametrize("name", ["binding_model", "binding_decoy", "binding_dose"])
def test_planted_findings_are_those_of_full_passes(name, monkeypatch):
    """Same selection, confirmation and knockout numbers (within 1e-5) as full passes, for fewer
    FLOPs (3 layers, circuit heads in layer 0: the saving is the tokens before the identities; the
    30-layer models save far more, test_smollm2_…)."""
    fixture = FIXTURES / name
    new, old = _planted_findings(fixture, monkeypatch, False), _planted_findings(fixture, monkeypatch, True)
    assert new["selected_heads"] == old["selected_heads"]
    assert [(h["layer"], h["head"]) for h in new["confirmation"]["heads"]] == [
        (h["layer"], h["head"]) for h in old["confirmation"]["heads"]
    ]
    a, b = (
        dict(_numbers({k: new[k] for k in ("confirmation", "knockout")})),
        dict(_numbers({k: old[k] for k in ("confirmation", "knockout")})),
    )
    assert a.keys() == b.keys()
    for key in a:
        if "ci95" in key or "p95" in key or "sd_pct" in key or "mean_pct" in key or "effect_pct" in key:
            continue  # derived from the ΔS below (percentages of a ratio): compared relative below
        assert a[key] == pytest.approx(b[key], abs=SAME) or (math.isnan(a[key]) and math.isnan(b[key])), key
    for key in a:
        assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-3) or math.isnan(b[key]), key
    cost = new["cost"]
    print(
        f"{name}: forward-pass FLOPs {cost['forward_flops']:.4g} of {cost['forward_flops_full_passes']:.4g} "
        f"as full passes ({cost['forward_flops'] / cost['forward_flops_full_passes']:.3f})"
    )
    assert cost["forward_flops"] < 0.75 * cost["forward_flops_full_passes"]


@pytest.mark.slow(minutes=4)
def test_smollm2_resumed_knockouts_equal_full_passes(smollm2):
    tok, model = load_tokenizer(smollm2), load_model(smollm2)
    pairs = build_pairs(load_benchmark("builtin"), seed=0, max_pairs=8)
    cfg = model.config.get_text_config()
    edits = edits_for(cfg.num_hidden_layers, cfg.num_attention_heads)
    with surgery_attention_on(model):
        runner = PairRunner(model, encode_pairs(tok, pairs, "binding"), [p.item for p in pairs], option_token_ids(tok))
        swept, full = runner.sweep(edits), full_pass_scores(runner, edits)
    for s, f in zip(swept, full):
        np.testing.assert_allclose(s, f, atol=SAME, rtol=0)
    print("smollm2 sweep FLOPs / full passes:", runner.counter.flops / runner.full_flops)


@pytest.mark.parametrize("dose, screen", [(False, True), (True, True), (False, False)])
def test_find_heads_prints_its_flops_before_it_starts_and_records_them(tiny, small, dose, screen):
    path = char_model(tiny, "llama", CHAT)
    said: list[str] = []

    def progress(label: str, total: int):
        said.append(f"progress: {label}")
        return lambda n: None

    found = find_heads(
        path,
        small,
        FindParams(
            confirm=3,
            random_sets=2,
            batch_size=4,
            dose_response=dose,
            dose_grid=(0.0, 1.0, 2.0),
            awareness_alphas=(1.0,),
            exhaustive=not screen,
        ),
        progress=progress,
        report=said.append,
    )
    note = next(i for i, m in enumerate(said) if m.startswith("FLOPs: at most"))
    assert note < next(i for i, m in enumerate(said) if m.startswith("progress"))  # before any pass
    bound, today = (float(x) for x in re.findall(r"\d\.\d+e[+-]\d+", said[note])[:2])
    cost = found.cost
    spent = cost["forward_flops"] + cost["backward_flops"]
    assert (cost["backward_flops"] == 0) == (not screen)
    assert spent <= bound * 1.001 and cost["forward_flops_full_passes"] <= today * 1.001
    assert cost["share_of_full_passes"] == pytest.approx(spent / cost["forward_flops_full_passes"])
    # the exhaustive procedure's own passes, resumed, cost less than as full passes; the screened one
    # knocks out up to 2 × 3 heads here where --confirm 3 knocks out 3 (the denominator's procedure)
    assert screen or spent < cost["forward_flops_full_passes"]
    assert any(m.startswith(f"FLOPs: {spent:.3e}") for m in said)  # the count, after
