"""find-neurons / prune-neurons through the CLI (in process, so the capture can be watched)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from surgery.core.checkpoint import Checkpoint
from surgery.find.findings import load_findings
from surgery.find.neurons.find import scores_of
from surgery.find.neurons.pairs import load_pairs
from surgery.find.neurons.record import NeuronsFindings
from surgery.find.neurons.select import select
from tests.support.cli import main_output
from tests.support.neuron_pairs import write_pairs
from tests.support.tokenizer import save_char_tokenizer


@pytest.fixture
def setup(tiny, tmp_path):
    """A tiny model with a tokenizer, and a pairs file (one pair of it has unequal token counts)."""

    def make(arch: str = "llama", seed: int = 0):
        model = tiny(arch, seed=seed)
        save_char_tokenizer(model, bos=True)
        return model

    return make, write_pairs(tmp_path / "pairs.jsonl")


def _tensors(path) -> dict[str, np.ndarray]:
    out = {}
    for f in Checkpoint(path).weight_files:
        with safe_open(str(path / f), "np") as st:
            out.update({k: st.get_tensor(k) for k in st.keys()})
    return out


def _forbid_capture(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("capture ran: the findings should have come from the cache")

    monkeypatch.setattr("surgery.find.neurons.capture.capture_pooled", fail)  # neurons.py imports it at call time


def test_find_then_prune_any_n_without_a_forward_pass(setup, tmp_path, capsys, monkeypatch):
    make, pairs = setup
    model = make()
    code, out, err = main_output(
        capsys, "find-neurons", model, "--pairs", pairs, "--n", "5", "--out", tmp_path / "f.json"
    )
    assert code == 0, err
    assert "skipped 3 of 15 pairs" in err and "SES 3" in err
    assert "Neurons per layer" in out and "Category overlap" in out
    findings = load_findings(tmp_path / "f.json", "neurons", NeuronsFindings)
    raw = findings.to_dict()
    assert raw["dataset_sha256"] == load_pairs(pairs).sha256
    assert raw["dataset"]["skipped"] == {"SES": 3} and raw["dataset"]["pairs_used"] == 12
    assert raw["summary"]["n"] == 40 and len(raw["summary"]["layer_distribution"]) == 3
    assert raw["scores"]["layers"] == 3 and raw["scores"]["width"] == 48

    _forbid_capture(monkeypatch)
    code, _, err = main_output(
        capsys, "prune-neurons", model, "--pairs", pairs, "--n", 4, "--strict", "--out", tmp_path / "s"
    )
    assert code == 2 and "3 pairs tokenize to different lengths" in err  # a cache hit is no way around it
    for n in (4, 7):
        dest = tmp_path / f"pruned-{n}"
        code, out, err = main_output(capsys, "prune-neurons", model, "--pairs", pairs, "--n", n, "--out", dest)
        assert code == 0, err
        chosen = select(scores_of(findings), n)  # the defaults, from the same scores
        prov = json.loads((dest / "surgery.json").read_text())
        assert [(e["layer"], e["neuron"]) for e in prov["recipe"]["edits"]] == list(chosen.neurons)
        assert prov["neuron_selection"]["n"] == n and len(prov["neuron_selection"]["neurons"]) == n
        assert prov["neuron_findings"]["dataset_sha256"] == raw["dataset_sha256"]
        assert prov["neuron_findings"]["from_cache"] is True
        layers = {layer for layer, _ in chosen.neurons}  # gate, up and down of each edited layer
        assert prov["verification"]["max_diff_over_bound"] <= 1.0 and prov["verification"]["maps"] == 3 * len(layers)
    _check_pruned(model, tmp_path / "pruned-7", chosen.neurons, factor=0.0)
    # --category only selects: the findings over every category serve it
    code, _, err = main_output(
        capsys,
        "prune-neurons",
        model,
        "--pairs",
        pairs,
        "--n",
        3,
        "--category",
        "Gender",
        "--json",
        "--out",
        tmp_path / "gender",
    )
    assert code == 0, err
    assert json.loads((tmp_path / "gender" / "surgery.json").read_text())["neuron_selection"]["categories"] == [
        "Gender"
    ]


def test_n_sweep_json_is_one_document(setup, tmp_path, capsys):
    make, pairs = setup
    model = make()
    code, out, err = main_output(
        capsys,
        "prune-neurons",
        model,
        "--pairs",
        pairs,
        "--n",
        "2,3",
        "--no-verify",
        "--json",
        "--out",
        tmp_path / "sweep",
    )
    assert code == 0, err
    doc = json.loads(out)  # one document: a list with one object per value
    assert [d["label"] for d in doc] == ["n-2", "n-3"]
    assert [d["neuron_selection"]["n"] for d in doc] == [2, 3] and [d["edits"] for d in doc] == [2, 3]
    assert all(Path(d["out"]).is_dir() for d in doc)


@pytest.mark.parametrize("damage", ["truncated", "no-scores"])
def test_damaged_cache_entry_is_recomputed(setup, tmp_path, capsys, damage):
    """A cache entry cut short (a crash, a full disk) or without readable scores is captured again,
    never an error and never trusted, as find-heads does."""
    make, pairs = setup
    model = make()
    code, _, err = main_output(capsys, "find-neurons", model, "--pairs", pairs, "--out", tmp_path / "f.json")
    assert code == 0, err
    [entry] = list(Path(os.environ["SURGERY_CACHE"]).rglob("*.json"))
    if damage == "truncated":
        entry.write_text(entry.read_text()[:200])
    else:
        doc = json.loads(entry.read_text())
        doc["scores"] = {"layers": 3}
        entry.write_text(json.dumps(doc))
    code, _, err = main_output(capsys, "prune-neurons", model, "--pairs", pairs, "--n", 4, "--out", tmp_path / "p")
    assert code == 0, err
    prov = json.loads((tmp_path / "p" / "surgery.json").read_text())
    assert prov["neuron_findings"]["from_cache"] is False
    assert (
        load_findings(entry, "neurons").to_dict()["scores"]
        == load_findings(tmp_path / "f.json", "neurons").to_dict()["scores"]
    )


def _check_pruned(source, baked, neurons, factor: float, fused: bool = False, width: int = 48):
    """Exactly the chosen neurons changed: down_proj columns scaled, gate/up rows zeroed when pruning."""
    before, after = _tensors(source), _tensors(baked)
    by_layer: dict[int, set[int]] = {}
    for layer, idx in neurons:
        by_layer.setdefault(layer, set()).add(idx)
    for layer in range(3):
        chosen = sorted(by_layer.get(layer, ()))
        others = [i for i in range(width) if i not in chosen]
        down = f"model.layers.{layer}.mlp.down_proj.weight"
        np.testing.assert_array_equal(after[down][:, others], before[down][:, others])
        np.testing.assert_allclose(after[down][:, chosen], before[down][:, chosen] * factor, rtol=1e-6)
        inputs = ["gate_up_proj"] if fused else ["gate_proj", "up_proj"]
        for name in inputs:
            w = f"model.layers.{layer}.mlp.{name}.weight"
            rows = [r for i in chosen for r in ((i, width + i) if fused else (i,))]
            keep = [r for r in range(before[w].shape[0]) if r not in rows]
            np.testing.assert_array_equal(after[w][keep], before[w][keep])
            expected = np.zeros_like(before[w][rows]) if factor == 0 else before[w][rows]
            np.testing.assert_array_equal(after[w][rows], expected)


def test_phi3_fused_gate_up_and_steering_factor(setup, tmp_path, capsys):
    make, pairs = setup
    model = make("phi3")
    code, _, err = main_output(
        capsys,
        "prune-neurons",
        model,
        "--pairs",
        pairs,
        "--n",
        6,
        "--score",
        "signed",
        "--select",
        "global",
        "--out",
        tmp_path / "zero",
    )
    assert code == 0, err
    neurons = [
        (e["layer"], e["neuron"])
        for e in json.loads((tmp_path / "zero" / "surgery.json").read_text())["recipe"]["edits"]
    ]
    _check_pruned(model, tmp_path / "zero", neurons, 0.0, fused=True)
    code, out, err = main_output(
        capsys,
        "prune-neurons",
        model,
        "--pairs",
        pairs,
        "--n",
        6,
        "--score",
        "signed",
        "--select",
        "global",
        "--factor",
        -0.5,
        "--json",
        "--out",
        tmp_path / "flip",
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["neuron_selection"]["factor"] == -0.5 and report["neuron_selection"]["score"] == "signed"
    assert [(r["layer"], r["neuron"]) for r in report["neuron_selection"]["neurons"]] == neurons
    _check_pruned(model, tmp_path / "flip", neurons, -0.5, fused=True)


def test_layers_category_and_named_neurons_modes(setup, tmp_path, capsys):
    make, pairs = setup
    model = make()
    code, out, err = main_output(
        capsys,
        "find-neurons",
        model,
        "--pairs",
        pairs,
        "--category",
        "Age,gender",
        "--layers",
        "1-2",
        "--n",
        4,
        "--select",
        "intersection",
        "--json",
    )
    assert code == 0, err
    shown = json.loads(out)["summary"]
    assert shown["categories"] == ["Age", "Gender"] and shown["rule"] == "intersection"
    assert {r["layer"] for r in shown["neurons"]} <= {1, 2} and shown["layer_distribution"][0] == 0
    code, _, err = main_output(capsys, "prune-neurons", model, "--neurons", "1:3,2:47", "--out", tmp_path / "named")
    assert code == 0, err
    _check_pruned(model, tmp_path / "named", [(1, 3), (2, 47)], 0.0)


def test_findings_of_another_model_are_refused(setup, tmp_path, capsys):
    make, pairs = setup
    first, second = make(seed=0), make(seed=1)
    assert main_output(capsys, "find-neurons", first, "--pairs", pairs, "--out", tmp_path / "f.json")[0] == 0
    code, _, err = main_output(
        capsys, "prune-neurons", second, "--n", 3, "--findings", tmp_path / "f.json", "--out", tmp_path / "x"
    )
    assert code == 2 and "same architecture; pass --transfer" in err
    code, _, err = main_output(
        capsys,
        "prune-neurons",
        second,
        "--n",
        3,
        "--findings",
        tmp_path / "f.json",
        "--transfer",
        "--out",
        tmp_path / "x",
    )
    assert code == 0, err
    other = make("gemma3_text")
    code, _, err = main_output(
        capsys, "prune-neurons", other, "--n", 3, "--findings", tmp_path / "f.json", "--out", tmp_path / "y"
    )
    assert code == 2 and "different model" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--n", "145", "--spare-active", "0"],
            "--n 145 is out of range: the model has 144 selectable MLP neurons (3 layers × 48); choose 1..144",
        ),
        (["--n", "144"], "the model has 141 selectable MLP neurons (3 layers × 48, after sparing the 0.01 most"),
        (["--n", "3", "--neurons", "1:2"], "give exactly one of --neurons"),
        ([], "give exactly one of --neurons"),
        (["--n", "2.5"], "--n must be whole numbers"),
        (["--n", "x"], "--n: 'x' is not a number (give one value or a list like 20,40)"),  # not 1.5,2,2.5
        # capture options beside --findings were ignored when they equalled the defaults (--pairs builtin)
        (["--n", "3", "--findings", "f.json", "--pairs", "builtin"], "--findings already holds the scores; drop"),
        (["--n", "3", "--findings", "f.json", "--pairs", "builtin", "--strict"], "--findings already holds the"),
        (["--n", "3", "--factor", "1"], "--factor 1 leaves every neuron unchanged"),
        (["--n", "3", "--category", "Nationality"], "category Nationality not in these pairs"),
        (["--n", "3", "--layers", "2-1"], "runs backwards"),
        (["--n", "3", "--strict"], "tokenize to different lengths"),
    ],
)
def test_prune_errors_are_one_line(setup, tmp_path, capsys, args, message):
    make, pairs = setup
    code, _, err = main_output(capsys, "prune-neurons", make(), "--pairs", pairs, *args, "--out", tmp_path / "o")
    assert code == 2
    assert err.count("Error: ") == 1 and message in err, err
