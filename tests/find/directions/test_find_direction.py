"""find-direction and ablate-direction: findings, cache, kernel, MoE layers, torchrun, bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import surgery
from surgery.core.errors import ParameterError
from surgery.core.prompts import formatted
from surgery.find.directions import find as find_module
from surgery.find.directions.ablate import layer_weights
from surgery.find.directions.find import directions
from surgery.find.directions.params import KernelParams
from tests.support.cli import cli_env, error_line, run_here, run_main
from tests.support.paths import FIXTURES, REPO
from tests.support.tokenizer import char_tokenizer

FIXTURE = FIXTURES / "direction_model"


@pytest.fixture
def prompts(tmp_path) -> tuple[Path, Path]:
    """The first 24 prompts of each side of the planted task."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    for name, path in (("a", a), ("b", b)):
        path.write_text("\n".join((FIXTURE / f"{name}.txt").read_text().splitlines()[:24]) + "\n")
    return a, b


def test_findings_record_and_cache(prompts, monkeypatch):
    a, b = prompts
    found = surgery.find_direction(FIXTURE, a=a, b=b, device="cpu", batch_size=5)
    data = found.data
    assert not found.from_cache and data.kind == "directions" and data.dataset.chat_template is False
    assert [r.layer for r in data.layers] == [0, 1] and data.dataset.a.prompts == 24
    cosine = np.array(data.cosine)
    assert np.allclose(np.diag(cosine), 1.0) and np.allclose(cosine, cosine.T)
    from safetensors.numpy import load_file

    vectors = load_file(str(found.vectors))
    assert sorted(vectors) == ["layer.0", "layer.1", "mean_a.0", "mean_a.1", "mean_b.0", "mean_b.1"]
    assert np.allclose(vectors["layer.1"], vectors["mean_a.1"] - vectors["mean_b.1"], atol=1e-6)
    assert data.layers[1].norm == pytest.approx(float(np.linalg.norm(vectors["layer.1"])), rel=1e-6)

    # A second run reads the cache: no model is loaded.
    monkeypatch.setattr(find_module, "load_model", lambda *a, **k: pytest.fail("the cache was not used"))
    again = surgery.find_direction(FIXTURE, a=a, b=b, device="cpu", batch_size=5)
    assert again.from_cache and again.data == data
    # A batch size gives the same residuals (right padding: a prompt's last token is its own).
    monkeypatch.undo()
    other = surgery.find_direction(FIXTURE, a=a, b=b, device="cpu", batch_size=24, recompute=True)
    assert np.allclose(load_file(str(other.vectors))["layer.0"], vectors["layer.0"], atol=1e-5)


def test_projected_directions_lose_their_component_along_the_b_mean():
    rng = np.random.default_rng(0)
    xa, xb = rng.standard_normal((30, 3, 8)) + 1.0, rng.standard_normal((20, 3, 8))
    plain, rows, _ = directions(xa, xb, projected=False)
    projected, _, _ = directions(xa, xb, projected=True)
    for layer in range(3):
        mean_b = xb[:, layer].mean(axis=0)
        assert np.allclose(plain[f"layer.{layer}"], xa[:, layer].mean(axis=0) - mean_b, atol=1e-6)
        assert abs(projected[f"layer.{layer}"] @ mean_b) < 1e-5 * np.linalg.norm(mean_b)
        assert rows[layer]["accuracy"] > 0.5 and rows[layer]["separation"] > 0


def test_instruct_prompts_go_through_the_chat_template():
    template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    texts, special = formatted(char_tokenizer(template), ("hi",), "auto")
    assert texts == ["<hi>A:"] and special is False
    assert formatted(char_tokenizer(template), ("hi",), "plain") == (["hi"], True)
    with pytest.raises(ParameterError, match="no chat template"):
        formatted(char_tokenizer(), ("hi",), "chat")


def test_the_weight_kernel():
    kernel = KernelParams(weight=1.0, position=4, floor=0.2, width=4)
    weights = layer_weights(kernel, 10, best=0)
    assert weights == pytest.approx({0: 0.2, 1: 0.4, 2: 0.6, 3: 0.8, 4: 1.0, 5: 0.8, 6: 0.6, 7: 0.4, 8: 0.2})
    assert layer_weights(KernelParams(weight=0.5, layers="3-5"), 10, best=7) == {3: 0.5, 4: 0.5, 5: 0.5}
    # no floor: flat at the peak; no width: as far as the furthest layer, which gets the floor
    assert layer_weights(KernelParams(floor=0.0), 5, best=4) == pytest.approx(
        {0: 0.0, 1: 0.25, 2: 0.5, 3: 0.75, 4: 1.0}
    )


def test_ablate_direction_on_a_mixture_of_experts_edits_every_expert(tiny, tmp_path):
    from tests.support.tokenizer import save_char_tokenizer

    src = tiny("qwen2_moe", vocab_size=128)
    save_char_tokenizer(src)
    (tmp_path / "a.txt").write_text("the sky is green\nno red is blue\nwhat is this\n")
    (tmp_path / "b.txt").write_text("a quiet day\nmost cats sleep\nrain again\n")
    found = surgery.find_direction(src, a=tmp_path / "a.txt", b=tmp_path / "b.txt", device="cpu")
    baked = surgery.ablate_direction(src, tmp_path / "out", direction=found.path, layers="1", weight=0.5)
    edits = baked.provenance.recipe.edits
    assert [e.module for e in edits] == ["attention", "experts", "shared_experts"]
    experts = [e for e in baked.provenance.edited_tensors if ".experts." in e.tensor]
    assert len(experts) == 4 and all(abs(e.direction_left - 0.5) < 1e-5 for e in experts)
    assert surgery.verify(src, tmp_path / "out").ok


def test_the_table_says_how_many_prompts_its_accuracy_is_of(tmp_path, monkeypatch, capsys):
    """100 % accuracy on one prompt says little: the table names each side's count, and that it is in-sample."""
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache"))
    a = _write(tmp_path / "a.txt", (FIXTURE / "a.txt").read_text().splitlines()[0] + "\n")
    res = run_main(["find-direction", FIXTURE, "--a", a, "--b", FIXTURE / "b.txt", "--device", "cpu"], capsys)
    assert res.returncode == 0, res.stderr
    b_count = len([line for line in (FIXTURE / "b.txt").read_text().splitlines() if line.strip()])
    caption = f"--a: 1 prompt, --b: {b_count} prompts; separation and accuracy are measured on these same prompts"
    assert caption in " ".join(res.stdout.split())


def test_one_prompt_a_side_has_no_best_layer(tmp_path, monkeypatch, capsys):
    """Every layer separates one prompt from one other infinitely: "Best separation at layer 0" was
    the first of the tie, and ablate-direction --width peaked there without a word."""
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache"))
    a, b = (_write(tmp_path / f"{s}.txt", (FIXTURE / f"{s}.txt").read_text().splitlines()[0] + "\n") for s in "ab")
    found = tmp_path / "one.json"
    res = run_main(["find-direction", FIXTURE, "--a", a, "--b", b, "--device", "cpu", "--out", found], capsys)
    assert res.returncode == 0, res.stderr
    assert "Layers 0, 1 separate equally well (no spread within a set): no best layer." in " ".join(res.stdout.split())
    falling = ["ablate-direction", FIXTURE, "--direction", found, "--width", "1", "--floor", "0.5"]
    line = error_line(run_main([*falling, "--out", tmp_path / "o1"], capsys))
    assert "--position is needed: layers 0, 1 of the findings separate the two sets equally well (inf)" in line
    assert not (tmp_path / "o1").exists()
    assert run_main([*falling, "--position", "1", "--out", tmp_path / "o2"], capsys).returncode == 0
    flat = run_main(["ablate-direction", FIXTURE, "--direction", found, "--out", tmp_path / "o3"], capsys)
    assert flat.returncode == 0, flat.stderr  # every layer at one weight: no peak to place


def test_find_direction_on_two_ranks_equals_one_process(prompts, tmp_path, monkeypatch, capsys):
    """torchrun with 2 processes: each runs its own batches, the rows are gathered; same findings."""
    a, b = prompts
    args = ["find-direction", FIXTURE, "--a", a, "--b", b, "--batch-size", "4", "--device", "cpu", "--json", "--out"]
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache-1"))
    assert run_main([*args, tmp_path / "one.json"], capsys).returncode == 0
    env = cli_env(
        OMP_NUM_THREADS="1",
        SURGERY_CACHE=str(tmp_path / "cache-2"),
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "surgery",
            *map(str, args),
            tmp_path / "two.json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    from safetensors.numpy import load_file

    one, two = (json.loads((tmp_path / f"{k}.json").read_text()) for k in ("one", "two"))
    assert one["best_layer"] == two["best_layer"] and one["dataset"] == two["dataset"]
    for r1, r2 in zip(one["layers"], two["layers"], strict=True):
        assert r1 == pytest.approx(r2, rel=1e-5)
    v1, v2 = (load_file(str(tmp_path / f"{k}.safetensors")) for k in ("one", "two"))
    assert all(np.allclose(v1[k], v2[k], rtol=1e-5, atol=1e-7) for k in v1)


@pytest.fixture(scope="module")
def found(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("found")
    for name in ("a", "b"):
        (folder / f"{name}.txt").write_text("\n".join((FIXTURE / f"{name}.txt").read_text().splitlines()[:8]) + "\n")
    env = {**cli_env(OMP_NUM_THREADS="1"), "SURGERY_CACHE": str(folder / "cache")}
    res = run_here(
        [
            "find-direction",
            FIXTURE,
            "--a",
            folder / "a.txt",
            "--b",
            folder / "b.txt",
            "--out",
            folder / "found.json",
            "--device",
            "cpu",
        ],
        env=env,
    )
    assert res.returncode == 0, res.stderr
    return folder / "found.json"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


BAD = [
    ("one-side", lambda t, f: ["find-direction", FIXTURE, "--a", FIXTURE / "a.txt"], ("give both --a and --b",)),
    (
        "empty",
        lambda t, f: ["find-direction", FIXTURE, "--a", _write(t / "e.txt", "\n \n"), "--b", FIXTURE / "b.txt"],
        ("holds no prompts", "one prompt a line"),
    ),
    (
        "missing",
        lambda t, f: ["find-direction", FIXTURE, "--a", t / "none.txt", "--b", FIXTURE / "b.txt"],
        ("none.txt does not exist",),
    ),
    (  # a folder is there: not "does not exist"
        "folder",
        lambda t, f: ["find-direction", FIXTURE, "--a", t, "--b", FIXTURE / "b.txt"],
        ("is a folder; give a text file",),
    ),
    (
        "same-prompts",
        lambda t, f: ["find-direction", FIXTURE, "--a", FIXTURE / "a.txt", "--b", FIXTURE / "a.txt"],
        ("--a and --b hold the same prompts", "give two sets"),
    ),
    (
        "jsonl-line",
        lambda t, f: [
            "find-direction",
            FIXTURE,
            "--a",
            _write(t / "a.jsonl", '{"prompt": "x"}\n[1]\n'),
            "--b",
            FIXTURE / "b.txt",
        ],
        ("line 2 of", "fix that line"),
    ),
    (  # read as text, a JSON array's "[" and each JSONL object's braces were prompts, without a word
        "json-not-jsonl",
        lambda t, f: ["find-direction", FIXTURE, "--a", _write(t / "a.json", '["x", "y"]\n'), "--b", FIXTURE / "b.txt"],
        ("a.json is JSON, not a prompts format", "or JSONL (a.jsonl: one object"),
    ),
    (
        "no-chat-template",
        lambda t, f: [
            "find-direction",
            FIXTURE,
            "--a",
            FIXTURE / "a.txt",
            "--b",
            FIXTURE / "b.txt",
            "--template",
            "chat",
        ],
        ("no chat template", "use --template plain"),
    ),
    (  # the vectors went there, then the findings JSON over them: a pair that never read back
        "out-names-the-vectors",
        lambda t, f: [
            "find-direction",
            FIXTURE,
            "--a",
            FIXTURE / "a.txt",
            "--b",
            FIXTURE / "b.txt",
            "--out",
            t / "d.safetensors",
        ],
        ("d.safetensors names the vectors file", "give the JSON's name, e.g. --out", "d.json"),
    ),
    (
        "weight-nan",
        lambda t, f: ["ablate-direction", FIXTURE, "--direction", f, "--weight", "nan"],
        ("--weight (KernelParams.weight) must be a finite number",),
    ),
    (
        "layers-outside",
        lambda t, f: ["ablate-direction", FIXTURE, "--direction", f, "--layers", "1-5"],
        ("--layers names layer 5, but the model has layers 0..1",),
    ),
    (  # an unset shell variable: every layer was edited without a word
        "layers-empty",
        lambda t, f: ["ablate-direction", FIXTURE, "--direction", f, "--layers", " "],
        ("--layers is empty", "leave it out for every layer"),
    ),
    (
        "modules",
        lambda t, f: ["ablate-direction", FIXTURE, "--direction", f, "--modules", "attention,lm_head"],
        ("--modules must list attention and/or mlp",),
    ),
    (
        "direction-layer",
        lambda t, f: ["ablate-direction", FIXTURE, "--direction", f, "--direction-layer", "2"],
        ("--direction-layer 2 is not a layer of the findings (0..1)",),
    ),
    (
        "not-direction-findings",
        lambda t, f: ["ablate-direction", FIXTURE, "--direction", FIXTURES / "bias_model" / "ground_truth.json"],
        ("not a surgery findings file", "surgery find-direction"),
    ),
    (
        "vectors-gone",
        lambda t, f: ["ablate-direction", FIXTURE, "--direction", _moved(t, f)],
        ("which is not next to it", "keep the two files together"),
    ),
]


def _moved(tmp: Path, findings: Path) -> Path:
    """A copy of the findings without its vectors file."""
    shutil.copy(findings, tmp / "alone.json")
    return tmp / "alone.json"


@pytest.mark.parametrize("case,args,needles", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_one_line_and_writes_nothing(case, args, needles, found, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache"))
    argv = args(tmp_path, found)
    if argv[0] == "ablate-direction":
        argv += ["--out", tmp_path / "out"]
    line = error_line(run_main(argv, capsys))
    for needle in needles:
        assert needle in line, line
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()
