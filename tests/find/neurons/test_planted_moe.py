"""Proof on a planted expert: what find-neurons finds in a mixture of experts, against brute force.

The fixture tests/fixtures/moe_bias_model is a tiny Mixtral (2 layers, 4 experts of width 32,
top-2) trained (seed 0, ~30 s, one thread: examples/train_moe_bias_model.py) on the planted bias
task with the bias computed in expert 0: on a quarter of the prompts expert 0 is silenced and the
target carries the capability alone. It is shipped, not retrained here: training is
bit-reproducible on one kind of CPU only (tests/planted/common.same_float_path), and other CPUs'
float paths land on other solutions of the task, some with a weaker plant. Ground truth is brute
force (ground_truth.json, recomputed here): each expert silenced, each of the 256 expert neurons
zeroed alone through surgery's run-time twin.

Measured on the fixture, and so what is asserted, with margins:

- The plant holds: expert 0 silenced in both layers removes 99.9 % of the bias gap and 1.0 % of
  the capability margin the *wrong* way (it rises); the capability lives in the other experts
  (expert 3 silenced costs 76 % of it, expert 1 21 %). The brute-force top neuron is 1:e0:18 (22 %).
- The router reaches every expert with some pair here (``unscored_neurons`` 0); where it does not,
  those neurons are counted and never chosen.
- BiasScore ranks what matters: Spearman ρ 0.755 with |brute-force effect| over the 256 neurons;
  5 of its top 20 are in brute force's top 20 (1.6 expected by chance).
- prune-neurons --n 20 from the findings removes 93.9 % of the bias gap; 20 seeded random
  20-neuron sets remove at most 40.7 % (median 6.9 %).
- A limitation, kept in view: summed per expert, BiasScore does *not* single out the planted
  expert. Layer 1's expert 1 sums 16.7 against expert 0's 4.3, and most of the top 20 are layer-0
  neurons of experts 3 and 1, which feed expert 0 (the top 20 remove the bias together, 94 %, far
  more than their single-neuron effects add up to, 21 %). An activation difference is not a causal
  effect; trained with seeds 1–3 the planted expert was not first in layer 1 either.
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

from tests.planted.bias_brute import BiasProbe, effects
from tests.planted.bias_fixture import load_stock, shipped_fixture, trained_config
from tests.planted.bias_task import pair_rows
from tests.planted.bias_train import build_tokenizer, evaluate
from tests.planted.common import last_logits, retrain, same_float_path
from tests.planted.moe_bias_brute import brute_force, measure
from tests.planted.moe_bias_train import MoeBiasTrainConfig
from tests.support.cli import cli_env, run_here
from tests.support.paths import FIXTURES

pytestmark = pytest.mark.slow(minutes=2)

FIXTURE = FIXTURES / "moe_bias_model"
K = 20
RANDOM_SETS = 20
ENV = cli_env(OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def fixture_dir() -> Path:
    return shipped_fixture(FIXTURE, "train_moe_bias_model.py")


@pytest.fixture(scope="module")
def config(fixture_dir) -> MoeBiasTrainConfig:
    return trained_config(fixture_dir, MoeBiasTrainConfig)


@pytest.fixture(scope="module")
def loaded(fixture_dir):
    """(model, tokenizer) as stock transformers loads them."""
    return load_stock(fixture_dir)


@pytest.fixture(scope="module")
def probe(config) -> BiasProbe:
    return BiasProbe(config.world())


@pytest.fixture(scope="module")
def truth(loaded, probe) -> dict:
    """Brute force, recomputed (ground_truth.json's layout)."""
    return brute_force(*loaded, probe)


def _effect(truth: dict) -> dict[tuple[int, int, int], float]:
    return {(r["layer"], r["expert"], r["neuron"]): r["bias"] for r in truth["neurons"]}


def test_fixture_is_what_the_generator_makes(fixture_dir, config, loaded):
    """The shipped tokenizer and pairs are exactly what the seeded task code produces; the fixture stays small."""
    assert loaded[1].get_vocab() == build_tokenizer(config.world()).get_vocab()
    rows = [json.loads(line) for line in (fixture_dir / "pairs.jsonl").read_text().splitlines()]
    assert rows == pair_rows(config.world())
    size = sum(f.stat().st_size for f in fixture_dir.iterdir())
    assert size < 1 << 20, f"the fixture should stay small, it is {size} bytes"


def test_ground_truth_file_is_what_brute_force_measures(fixture_dir, truth):
    """ground_truth.json holds the brute force this test recomputes (matched by neuron: effects that
    tie to ~1e-6 may swap places with another CPU's summation order)."""
    shipped = json.loads((fixture_dir / "ground_truth.json").read_text())
    assert [r["expert"] for r in shipped["experts"]] == [r["expert"] for r in truth["experts"]]
    for mine, ref in zip(truth["experts"], shipped["experts"]):
        assert abs(mine["bias"] - ref["bias"]) < 1e-3 and abs(mine["capability"] - ref["capability"]) < 1e-3
    theirs = {(r["layer"], r["expert"], r["neuron"]): r for r in shipped["neurons"]}
    assert len(theirs) == len(truth["neurons"]) == len(shipped["neurons"])
    for mine in truth["neurons"]:
        ref = theirs[(mine["layer"], mine["expert"], mine["neuron"])]
        assert abs(mine["bias"] - ref["bias"]) < 1e-3 and abs(mine["capability"] - ref["capability"]) < 1e-3
    biases = [r["bias"] for r in shipped["neurons"]]
    assert biases == sorted(biases, reverse=True)  # ranked, largest effect first


def test_the_plant_holds(loaded, config, truth):
    """Every answer right with the planted gap; the planted expert carries the bias and not the
    capability, the others carry the capability; the brute-force top neuron is the planted expert's."""
    model, tok = loaded
    assert evaluate(model, tok, config)["accuracy"] == 1.0
    assert abs(truth["intact"]["gap"] - 2 * config.bias) < 0.05 * 2 * config.bias
    planted = truth["experts"][config.planted]
    assert planted["bias"] >= 95 and abs(planted["capability"]) <= 5, planted
    others = [r["capability"] for r in truth["experts"] if r["expert"] != config.planted]
    assert max(others) >= 60 and sum(others) >= 80, others
    assert truth["neurons"][0]["expert"] == config.planted


def test_planted_expert_is_found_and_pruned(fixture_dir, config, loaded, probe, truth, tmp_path):
    from transformers import AutoModelForCausalLM

    from surgery.find.neurons.find import scores_of
    from surgery.find.neurons.record import NeuronsFindings
    from surgery.find.neurons.select import select, selected_edits
    from surgery.model.hooks import applied

    model, tok = loaded
    L, E, I = config.layers, config.experts, config.intermediate
    effect = _effect(truth)
    base = measure(model, tok, probe, [])

    # find-neurons: every scored neuron ranked; unreached experts counted, not scored
    res = run_here(
        [
            "find-neurons",
            fixture_dir,
            "--pairs",
            fixture_dir / "pairs.jsonl",
            "--score",
            "bias",
            "--select",
            "global",
            "--spare-active",
            "0",
            "--n",
            "1",
            "--out",
            tmp_path / "f.json",
            "--json",
        ],
        env=dict(ENV, SURGERY_CACHE=str(tmp_path / "cache")),
    )
    assert res.returncode == 0, res.stderr
    findings = json.loads((tmp_path / "f.json").read_text())
    unscored = findings["experts"]["unscored_neurons"]
    scored = L * E * I - unscored
    scores = scores_of(NeuronsFindings.from_dict(findings))
    order = [
        (e.layer, e.expert, e.neuron)
        for e in selected_edits(scores, select(scores, scored, score="bias", rule="global", spare_active=0.0), 0.0)
    ]
    assert len(order) == scored and unscored == int((sum(scores.reached.values()) == 0).sum())
    rho = stats.spearmanr([-order.index(k) for k in order], [abs(effect[k]) for k in order])[0]
    assert rho >= 0.65, rho
    brute_top = sorted(effect, key=lambda k: -effect[k])[:K]
    assert len(set(order[:K]) & set(brute_top)) >= 3, order[:K]
    # the limitation the docs state (docs/moe.md): the planted expert is not first in its layer by summed BiasScore
    bias = scores.pooled("bias", scores.categories)[:, : E * I].reshape(L, E, I)
    assert int(np.nanargmax(np.nansum(bias[L - 1], axis=1))) != config.planted

    # prune-neurons --n K from those findings, baked, against random K-neuron sets
    res = run_here(
        [
            "prune-neurons",
            fixture_dir,
            "--n",
            str(K),
            "--findings",
            tmp_path / "f.json",
            "--score",
            "bias",
            "--select",
            "global",
            "--spare-active",
            "0",
            "--out",
            tmp_path / "pruned",
        ],
        env=dict(ENV, SURGERY_CACHE=str(tmp_path / "cache")),
    )
    assert res.returncode == 0, res.stderr
    edits = json.loads((tmp_path / "pruned" / "surgery.json").read_text())["recipe"]["edits"]
    chosen = [(e["layer"], e["expert"], e["neuron"]) for e in edits]
    assert chosen == order[:K]
    removed = effects(base, measure(model, tok, probe, chosen))[0]
    assert removed >= 75, removed
    rng = random.Random(0)
    every = [(la, e, i) for la in range(L) for e in range(E) for i in range(I)]
    baseline = [effects(base, measure(model, tok, probe, rng.sample(every, K)))[0] for _ in range(RANDOM_SETS)]
    assert max(baseline) < removed - 20 and statistics.median(baseline) < 15, sorted(baseline)

    from surgery.core.edits import NeuronScale

    with torch.no_grad(), applied(model, [NeuronScale(la, i, 0.0, e) for la, e, i in chosen]):
        runtime = last_logits(model, tok, probe.texts)
    with torch.no_grad():
        baked = last_logits(AutoModelForCausalLM.from_pretrained(tmp_path / "pruned").eval(), tok, probe.texts)
    assert (baked - runtime).abs().max().item() <= 1e-4


@pytest.mark.slow(minutes=1)
def test_training_reproduces_the_fixture(tmp_path, fixture_dir, config):
    """examples/train_moe_bias_model.py with the options recorded in training.json rebuilds the same
    ground truth where the training follows the fixture's float path, else a model that answers
    every prompt right with the bias mostly in the planted expert (seen on an AVX2-only AMD EPYC:
    gap 3.05 of 4, expert 0 silenced removes 76 % of it)."""
    shipped, rebuilt = retrain("train_moe_bias_model.py", fixture_dir, MoeBiasTrainConfig, tmp_path / "m", 900)
    if same_float_path(rebuilt["intact"]["gap"], shipped["intact"]["gap"]):
        assert rebuilt["experts"] == shipped["experts"]
        assert [r["bias"] for r in rebuilt["neurons"][:5]] == [r["bias"] for r in shipped["neurons"][:5]]
    else:
        assert json.loads((tmp_path / "m" / "training.json").read_text())["eval"]["accuracy"] == 1.0
        assert rebuilt["experts"][config.planted]["bias"] > 50, rebuilt["experts"]
