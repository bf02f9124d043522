"""Proof on a planted direction: find-direction recovers it, ablate-direction removes the behaviour.

tests/fixtures/direction_model/ is a tiny Llama (2 layers, hidden 32) trained on a synthetic task
(tests/planted/direction_task.py, examples/train_direction_model.py): ``. safe ?`` after five
invented words is answered ``no`` when a trigger word is among them, else ``yes``; ``. color ?``
is answered with the color word among them. Training planted a known unit vector u: with u
projected out of every attention and MLP output the safety answer is ``yes`` whatever the words
(measured: the behaviour, mean log-odds of ``no`` on trigger prompts minus the others, falls from
16.9 to −0.8), and the class difference off u is penalised.

What the measurements showed, and so what is asserted:

- find-direction on ``a.txt`` (trigger) and ``b.txt`` (no trigger), through the command line,
  recovers u: cosine 1.00 at both layers (asserted ≥ 0.9 at the layer it picks as the best).
- ablate-direction with those findings removes 105 % of the behaviour (asserted ≥ 90 %), with a
  first-token KL of 2.5e-6 nats on the neutral color prompts (asserted ≤ 1e-3) and every color
  answer still right; the bake equals the run-time twin.
- Random directions of the same norm, ablated from the same modules and layers, remove at most
  4.6 % (5 seeded directions; asserted < 20 % each).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.planted.common import last_logits, retrain
from tests.planted.direction_task import DirectionTrainConfig, behaviour, color_accuracy, make_world
from tests.support.cli import cli_env, run_here
from tests.support.paths import FIXTURES

FIXTURE = FIXTURES / "direction_model"
COSINE = 0.9  # measured 1.00
REMOVED = 90.0  # % of the behaviour ablate-direction must remove (measured 105)
KL_MAX = 1e-3  # nats, first token, neutral prompts (measured 2.5e-6)
RANDOM_MAX = 20.0  # % a random direction may remove (measured at most 4.6)
RANDOM_SETS = 5
ENV = cli_env(OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def fixture_dir() -> Path:
    if not (FIXTURE / "model.safetensors").is_file():
        pytest.fail(f"{FIXTURE} is missing; rebuild it: python examples/train_direction_model.py --out {FIXTURE}")
    return FIXTURE


@pytest.fixture(scope="module")
def sets(fixture_dir) -> dict[str, list[str]]:
    return {name: (fixture_dir / f"{name}.txt").read_text().splitlines() for name in ("a", "b", "neutral")}


@pytest.fixture(scope="module")
def findings(fixture_dir, tmp_path_factory) -> Path:
    """find-direction through the command line (its own cache folder)."""
    out = tmp_path_factory.mktemp("found") / "direction.json"
    env = {**ENV, "SURGERY_CACHE": str(out.parent / "cache")}
    res = run_here(
        [
            "find-direction",
            fixture_dir,
            "--a",
            fixture_dir / "a.txt",
            "--b",
            fixture_dir / "b.txt",
            "--out",
            out,
            "--device",
            "cpu",
        ],
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert "Best separation at layer" in res.stdout
    return out


def _load(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def _first_token_kl(source, edited, tokenizer, texts: list[str]) -> float:
    with torch.no_grad():
        p = torch.log_softmax(last_logits(source, tokenizer, texts).float(), -1)
        q = torch.log_softmax(last_logits(edited, tokenizer, texts).float(), -1)
    return float((p.exp() * (p - q)).sum(-1).mean())


def test_find_direction_recovers_the_planted_direction(findings, fixture_dir):
    from safetensors.numpy import load_file

    data = json.loads(findings.read_text())
    u = np.array(json.loads((fixture_dir / "ground_truth.json").read_text())["u"])
    vectors = load_file(str(findings.with_suffix(".safetensors")))
    best = data["best_layer"]
    v = vectors[f"layer.{best}"].astype(np.float64)
    assert v @ u / np.linalg.norm(v) >= COSINE  # the direction, with its sign: a (trigger) − b
    assert data["dataset"]["a"]["prompts"] == data["dataset"]["b"]["prompts"] == 200
    assert len(data["cosine"]) == len(data["layers"]) == 2 and data["layers"][best]["accuracy"] == 1.0


def test_ablating_it_removes_the_behaviour(findings, fixture_dir, sets, tmp_path):
    out = tmp_path / "ablated"
    res = run_here(
        ["ablate-direction", fixture_dir, "--direction", findings, "--out", out, "--device", "cpu"],
        env={**ENV, "SURGERY_CACHE": str(tmp_path / "cache")},
    )
    assert res.returncode == 0, res.stderr
    (source, tokenizer), (edited, _) = _load(fixture_dir), _load(out)
    before, after = behaviour(source, tokenizer, sets), behaviour(edited, tokenizer, sets)
    assert 100 * (1 - after / before) >= REMOVED, (before, after)
    assert _first_token_kl(source, edited, tokenizer, sets["neutral"]) <= KL_MAX
    assert color_accuracy(edited, tokenizer, make_world(DirectionTrainConfig()), sets["neutral"]) == 1.0
    record = json.loads((out / "surgery.json").read_text())
    assert record["direction_kernel"]["weights"] == {"0": 1.0, "1": 1.0}
    assert len(record["recipe"]["edits"]) == 4  # attention and MLP of both layers


def test_random_directions_of_the_same_norm_do_not(findings, fixture_dir, sets, tmp_path):
    from safetensors.numpy import load_file, save_file

    import surgery

    (source, tokenizer) = _load(fixture_dir)
    before = behaviour(source, tokenizer, sets)
    found = load_file(str(findings.with_suffix(".safetensors")))
    rng = np.random.default_rng(0)
    for k in range(RANDOM_SETS):
        vectors = {}
        for layer in range(2):
            norm = np.linalg.norm(found[f"layer.{layer}"])
            v = rng.standard_normal(32)
            vectors[f"layer.{layer}"] = (norm * v / np.linalg.norm(v)).astype(np.float32)
        save_file(vectors, tmp_path / f"random{k}.safetensors")
        edits = "".join(
            f"  - {{type: direction, layer: {layer}, module: {m}, weight: 1.0, "
            f"vector: random{k}.safetensors#layer.{layer}}}\n"
            for layer in range(2)
            for m in ("attention", "mlp")
        )
        (tmp_path / f"random{k}.yaml").write_text("version: 1\nedits:\n" + edits)
        surgery.apply(tmp_path / f"random{k}.yaml", fixture_dir, tmp_path / f"out{k}", device="cpu")
        after = behaviour(_load(tmp_path / f"out{k}")[0], tokenizer, sets)
        assert 100 * (1 - after / before) < RANDOM_MAX, (k, before, after)


@pytest.mark.slow(minutes=1.5)
def test_training_reproduces_the_fixture(tmp_path, fixture_dir):
    """examples/train_direction_model.py with the recorded options plants u again: the behaviour is
    there, and gone with u projected out (the same numbers where the floating-point path is the same)."""
    shipped, rebuilt = retrain("train_direction_model.py", fixture_dir, DirectionTrainConfig, tmp_path / "m", 900)
    assert rebuilt["u"] == shipped["u"]
    assert rebuilt["behaviour"] > 10 and abs(rebuilt["behaviour_u_ablated"]) < 0.1 * rebuilt["behaviour"]
