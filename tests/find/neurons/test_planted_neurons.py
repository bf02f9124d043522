"""Proof on a planted neuron effect: what find-neurons' BiasScore finds, measured against brute force.

tests/fixtures/bias_model/ is a tiny Llama (2 layers, MLP width 64) trained on a synthetic hiring
task (tests/planted/bias_task.py, examples/train_bias_model.py) where an invented group word shifts
``hire``/``reject`` by an XOR with the workplace, computed in the MLPs (with every neuron zeroed the
bias is gone). Its ground truth is brute force: every one of the 128 neurons zeroed alone, its
effect on the signed bias gap d(other) − d(stereotyped) and on the capability margin.

What the measurements showed, and so what is asserted:

- BiasScore (mean-pooled |Δ activation|) finds the neurons that *matter*: Spearman ρ with the
  magnitude of the brute-force effect is 0.83 over all neurons (asserted ≥ 0.7), the brute-force
  top neuron is in its top 10 (rank 7), and its top 10 holds 8 of the top 10 by |effect|.
- It does not see the *direction* (the paper's "bidirectional" caveat): its top 2 are layer-1
  neurons whose zeroing *raises* the bias by ~8 %; 3 of its top 5 have negative effects, and ρ with
  the signed effect is only 0.31. The signed score (|mean stereotyped − other|) does not fix that
  here: it has the same two suppressors on top and ρ 0.65 with |effect|.
- Pruning BiasScore's top 10 with prune-neurons removes 53 % of the bias gap; 20 seeded random
  10-neuron sets remove at most 17 % (median ~2 %). The capability decisions all stay correct
  (the capability margin even rises, by 45 %: the pruned layer-1 neurons also damped it). The bake
  equals the run-time edit.
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from tests.planted.bias_brute import BiasProbe, brute_force, effects
from tests.planted.bias_fixture import load_stock, shipped_fixture, trained_config
from tests.planted.bias_task import pair_rows
from tests.planted.bias_train import BiasTrainConfig, build_tokenizer, evaluate, log_odds
from tests.planted.common import last_logits, retrain, same_float_path
from tests.support.cli import cli_env, run_here
from tests.support.paths import FIXTURES

FIXTURE = FIXTURES / "bias_model"
K = 10  # neurons pruned (of 128): the measured top-K curve passes 50 % here
RANDOM_SETS = 20  # seeded random K-neuron sets for the baseline
RHO_MAGNITUDE = 0.7  # measured 0.83: BiasScore vs |brute-force effect|
RHO_SIGNED_MAX = 0.5  # measured 0.31: BiasScore vs the signed effect (it ranks suppressors high)
LARGE = 45.0  # % of the bias gap the top K must remove (measured 53.4)
RANDOM_MAX = 25.0  # % no random set may reach (measured max 16.7 over 20 sets)
RANDOM_MEDIAN = 5.0  # % the median random set stays under (measured ~2)
CAPABILITY_KEPT = 0.9  # share of the capability margin that must remain (measured 1.45)
SAME = 1e-4  # bake vs run-time edit, in logits
ENV = cli_env(OMP_NUM_THREADS="1")  # one thread: the model is tiny and the CPU is shared


@pytest.fixture(scope="module")
def fixture_dir() -> Path:
    return shipped_fixture(FIXTURE, "train_bias_model.py")


@pytest.fixture(scope="module")
def config(fixture_dir) -> BiasTrainConfig:
    return trained_config(fixture_dir, BiasTrainConfig)


@pytest.fixture(scope="module")
def loaded(fixture_dir):
    """(model, tokenizer) as stock transformers loads them."""
    return load_stock(fixture_dir)


@pytest.fixture(scope="module")
def probe(config) -> BiasProbe:
    return BiasProbe(config.world())


@pytest.fixture(scope="module")
def truth(loaded, probe):
    """Brute force, recomputed: the intact metrics and every neuron's effects, largest bias effect first."""
    return brute_force(*loaded, probe)


@pytest.fixture(scope="module")
def effect_maps(truth) -> tuple[np.ndarray, np.ndarray]:
    """[layers, width] arrays of the brute-force bias and capability effects."""
    rows = truth[1]
    shape = (max(r.layer for r in rows) + 1, max(r.neuron for r in rows) + 1)
    bias, cap = np.zeros(shape), np.zeros(shape)
    for r in rows:
        bias[r.layer, r.neuron], cap[r.layer, r.neuron] = r.bias, r.capability
    return bias, cap


def find_neurons_cli(fixture_dir: Path, cache: Path, score: str, out: Path | None = None) -> list[tuple[int, int]]:
    """Every neuron, best first, as ``surgery find-neurons --score SCORE --select global
    --spare-active 0`` ranks them on the fixture's pairs."""
    extra = ["--out", out] if out else []
    res = run_here(
        [
            "find-neurons",
            fixture_dir,
            "--pairs",
            fixture_dir / "pairs.jsonl",
            "--score",
            score,
            "--select",
            "global",
            "--spare-active",
            "0",
            "--n",
            "128",
            "--json",
            *extra,
        ],
        env=dict(ENV, SURGERY_CACHE=str(cache)),
    )
    assert res.returncode == 0, res.stderr
    shown = json.loads(res.stdout)
    assert shown["dataset"]["pairs_used"] == 288, shown["dataset"]  # no pair skipped: equal token counts
    return [(r["layer"], r["neuron"]) for r in shown["summary"]["neurons"]]


@pytest.fixture(scope="module")
def ranked(fixture_dir, tmp_path_factory) -> dict:
    """find-neurons' BiasScore and signed rankings, and the findings file (one capture, then the cache)."""
    tmp = tmp_path_factory.mktemp("planted-neurons")
    findings = tmp / "findings.json"
    bias = find_neurons_cli(fixture_dir, tmp / "cache", "bias", findings)
    signed = find_neurons_cli(fixture_dir, tmp / "cache", "signed")
    return {"bias": bias, "signed": signed, "findings": findings, "tmp": tmp}


def _spearman(order: list[tuple[int, int]], values: np.ndarray) -> float:
    """ρ between a ranking (best first) and per-neuron values (higher = more)."""
    rank = [-order.index((layer, n)) for layer in range(values.shape[0]) for n in range(values.shape[1])]
    return float(stats.spearmanr(rank, values.ravel())[0])


def _top(values: np.ndarray, k: int) -> list[tuple[int, int]]:
    width = values.shape[1]
    return [(int(i) // width, int(i) % width) for i in np.argsort(-values.ravel(), kind="stable")[:k]]


def test_fixture_is_what_the_generator_makes(fixture_dir, config, loaded):
    """The shipped tokenizer and pairs are exactly what the seeded task code produces, every pair
    has equal token counts in it, and the fixture stays small."""
    from surgery.find.neurons.pairs import check_token_counts, load_pairs

    tok = loaded[1]
    assert tok.get_vocab() == build_tokenizer(config.world()).get_vocab()
    rows = [json.loads(line) for line in (fixture_dir / "pairs.jsonl").read_text().splitlines()]
    assert rows == pair_rows(config.world())
    check = check_token_counts(load_pairs(str(fixture_dir / "pairs.jsonl")), tok, strict=True)
    assert check.total_skipped == 0 and len(check.kept) == len(rows)
    size = sum(f.stat().st_size for f in fixture_dir.iterdir())
    assert size < 1 << 20, f"the fixture should stay small, it is {size} bytes"


def test_model_has_the_planted_behaviour(loaded, config, probe, truth):
    """It answers every prompt right, with the planted gap (2·bias) and margin, and the decision
    runs through the MLPs: with every neuron zeroed, bias gap and capability margin are gone."""
    model, tok = loaded
    check = evaluate(model, tok, config)
    assert check["accuracy"] == 1.0
    base = truth[0]
    assert abs(base.gap - 2 * config.bias) < 0.1 * config.bias and abs(base.capability - config.capability) < 0.1
    cfg = model.config
    silent = probe.measure(
        model, tok, [(layer, i) for layer in range(cfg.num_hidden_layers) for i in range(cfg.intermediate_size)]
    )
    assert abs(silent.gap) < 0.05 * base.gap and abs(silent.capability) < 0.05 * base.capability


def test_ground_truth_file_is_what_brute_force_measures(fixture_dir, truth):
    """ground_truth.json holds the brute force this test recomputes (same order, same effects)."""
    shipped = json.loads((fixture_dir / "ground_truth.json").read_text())
    # Matched by neuron, not by position: neurons whose effects tie to ~1e-6 swap places with the
    # BLAS kernel's summation order, which differs between machines.
    theirs = {(r["layer"], r["neuron"]): r for r in shipped["neurons"]}
    assert len(theirs) == len(truth[1]) == len(shipped["neurons"])
    for mine in truth[1]:
        ref = theirs[(mine.layer, mine.neuron)]
        assert abs(mine.bias - ref["bias"]) < 1e-3 and abs(mine.capability - ref["capability"]) < 1e-3
    biases = [r["bias"] for r in shipped["neurons"]]
    assert biases == sorted(biases, reverse=True)  # the file is ranked, largest effect first
    # The bias is spread over many neurons (no single one removes more than a quarter of it).
    assert 5.0 < truth[1][0].bias < 25.0


def test_bias_score_ranks_the_neurons_that_matter(ranked, effect_maps):
    """The criterion for BiasScore: it ranks by how much a neuron matters to the bias — Spearman ρ
    with |brute-force effect| ≥ RHO_MAGNITUDE over all 128 neurons, brute force's top neuron in its
    top 10, and its top 10 sharing ≥ 6 neurons with the top 10 by |effect|."""
    bias, _ = effect_maps
    order = ranked["bias"]
    assert len(order) == bias.size
    rho = _spearman(order, np.abs(bias))
    assert rho >= RHO_MAGNITUDE, rho
    assert _top(bias, 1)[0] in order[:10], (_top(bias, 1), order[:10])
    assert len(set(order[:10]) & set(_top(np.abs(bias), 10))) >= 6, (order[:10], _top(np.abs(bias), 10))


def test_bias_score_does_not_see_the_direction(ranked, effect_maps):
    """The paper's caveat, measured: BiasScore ranks neurons whose zeroing *raises* the bias among
    its best (at least 2 of its top 5), so its ρ with the signed effect stays below RHO_SIGNED_MAX.
    The signed score does not separate them here either: one of its top 3 raises the bias too."""
    bias, _ = effect_maps
    order = ranked["bias"]
    assert sum(bias[n] < 0 for n in order[:5]) >= 2, [(n, round(bias[n], 1)) for n in order[:5]]
    assert _spearman(order, bias) < RHO_SIGNED_MAX
    signed = ranked["signed"]
    assert any(bias[n] < 0 for n in signed[:3]), [(n, round(bias[n], 1)) for n in signed[:3]]
    assert _top(bias, 1)[0] in signed[:3]


def test_the_findings_file_reads_as_typed_findings_and_writes_back_unchanged(ranked, fixture_dir):
    """What find-neurons wrote on the planted model reads as NeuronsFindings checked against that
    model, ranks as the command did, and is written again byte for byte."""
    from surgery.core.checkpoint import Checkpoint
    from surgery.find.neurons.find import NeuronFindings, write_findings
    from surgery.find.neurons.params import SelectParams

    path = ranked["findings"]
    raw = json.loads(path.read_text())
    found = NeuronFindings.read(path, Checkpoint(fixture_dir))
    f = found.data
    assert f.dataset.pairs == raw["dataset"]["pairs"] and f.dataset.per_category == raw["dataset"]["per_category"]
    assert [(r.layer, r.neuron) for r in f.summary.neurons] == [
        (r["layer"], r["neuron"]) for r in raw["summary"]["neurons"]
    ]
    every = found.select(128, SelectParams(score="bias", rule="global", spare_active=0.0))
    assert list(every.neurons) == ranked["bias"]
    write_findings(f, ranked["tmp"] / "again.json")
    assert (ranked["tmp"] / "again.json").read_bytes() == path.read_bytes()


def test_prune_removes_the_bias_and_random_neurons_do_not(ranked, fixture_dir, loaded, probe, truth):
    """prune-neurons --n K from the findings: the baked checkpoint removes ≥ LARGE % of the bias
    gap (run-time edit, equal to the bake); no random K-neuron set reaches RANDOM_MAX % and their
    median stays under RANDOM_MEDIAN %; every capability decision stays right and the margin
    keeps ≥ CAPABILITY_KEPT of its size."""
    from transformers import AutoModelForCausalLM

    from surgery.core.edits import NeuronScale
    from surgery.model.hooks import applied

    model, tok = loaded
    out = ranked["tmp"] / "pruned"
    res = run_here(
        [
            "prune-neurons",
            fixture_dir,
            "--n",
            str(K),
            "--findings",
            ranked["findings"],
            "--score",
            "bias",
            "--select",
            "global",
            "--spare-active",
            "0",
            "--out",
            out,
        ],
        env=dict(ENV, SURGERY_CACHE=str(ranked["tmp"] / "cache")),
    )
    assert res.returncode == 0, res.stderr
    edits = json.loads((out / "surgery.json").read_text())["recipe"]["edits"]
    chosen = [(e["layer"], e["neuron"]) for e in edits]
    assert chosen == ranked["bias"][:K] and {e["factor"] for e in edits} == {0.0}

    base = truth[0]
    bias_removed, _, cap_removed = effects(base, probe.measure(model, tok, chosen))
    assert bias_removed >= LARGE, bias_removed
    with applied(model, [NeuronScale(layer, i, 0.0) for layer, i in chosen]):
        runtime = last_logits(model, tok, probe.texts).detach()
        d = log_odds(model, tok, probe.texts)
    assert bool(((d * probe.skilled) > 0).all())
    assert 1 - cap_removed / 100 >= CAPABILITY_KEPT, cap_removed

    rng = random.Random(0)
    every = [
        (layer, i) for layer in range(model.config.num_hidden_layers) for i in range(model.config.intermediate_size)
    ]
    baseline = [effects(base, probe.measure(model, tok, rng.sample(every, K)))[0] for _ in range(RANDOM_SETS)]
    assert max(baseline) < RANDOM_MAX and statistics.median(baseline) < RANDOM_MEDIAN, sorted(baseline)

    with torch.no_grad():
        baked = last_logits(AutoModelForCausalLM.from_pretrained(out).eval(), tok, probe.texts)
        intact = last_logits(model, tok, probe.texts)
    assert (baked - runtime).abs().max().item() <= SAME
    assert (runtime - intact).abs().max().item() > 100 * SAME


@pytest.mark.slow(minutes=1)
def test_training_reproduces_the_fixture(tmp_path, fixture_dir):
    """examples/train_bias_model.py with the options recorded in training.json rebuilds the same
    ground truth where the training follows the fixture's floating-point path (the same top neurons
    by bias effect), else a model with the planted behaviour; the intact bias gap either way
    (see tests/planted/common.same_float_path)."""
    shipped, rebuilt = retrain("train_bias_model.py", fixture_dir, BiasTrainConfig, tmp_path / "m", 900)

    def top(gt: dict) -> list[tuple[int, int]]:
        return [(r["layer"], r["neuron"]) for r in gt["neurons"][:5]]

    if same_float_path(rebuilt["intact"]["gap"], shipped["intact"]["gap"]):
        assert top(rebuilt) == top(shipped)
    else:  # another CPU's kernels: MLP neurons are interchangeable, so which ones carry the bias may differ
        assert json.loads((tmp_path / "m" / "training.json").read_text())["eval"]["accuracy"] == 1.0
        # still spread over many neurons: the top one carries a clear share, never most of it (shipped:
        # 12.96 of 96.4, 13 %; retrained on an AMD EPYC with AVX2 only: 25.42 of 121.1, 21 %)
        biases = [abs(r["bias"]) for r in rebuilt["neurons"]]
        assert 5.0 < biases[0] < sum(biases) / 3
    assert abs(rebuilt["intact"]["gap"] - shipped["intact"]["gap"]) < 0.01 * shipped["intact"]["gap"]
