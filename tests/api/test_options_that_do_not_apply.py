"""Options a call cannot use are refused in one line, never dropped: verify of a baked GGUF, and a GGUF bake
of edits given by name (a recipe, neurons, heads), run no model (so no option of loading one applies), a
Recipe object without edits would bake a copy, and tune reads its own keep_memory (seed, batch size), not
its prompts'."""

from __future__ import annotations

import subprocess
import sys

import pytest

import surgery
from surgery.bake.gguf import bake_gguf
from surgery.core.edits import HeadScale, Recipe
from surgery.core.errors import CheckpointError, ParameterError, RecipeError
from surgery.gguf.model import open_gguf
from tests.support.cli import main_code
from tests.support.typed_gguf import write_typed_gguf


@pytest.fixture
def baked_gguf(tmp_path):
    src, out = tmp_path / "src.gguf", tmp_path / "out.gguf"
    write_typed_gguf(src, "Q8_0", head_dim=256)
    bake_gguf(open_gguf(src), Recipe((HeadScale(0, 1, 2.0),)), out)
    return src, out


def test_verify_of_a_baked_gguf_refuses_loading_options(baked_gguf):
    src, out = baked_gguf
    assert surgery.verify(src, out).ok  # the defaults: nothing refused
    with pytest.raises(ParameterError, match=r"is a baked GGUF: .* so device, dtype do not apply; leave them out"):
        surgery.verify(src, out, dtype="bfloat16", device="cpu")
    run = subprocess.run(
        [sys.executable, "-m", "surgery", "verify", str(src), str(out), "--dtype", "bfloat16"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "so --dtype does not apply; leave it out" in run.stderr, run.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["prune-neurons", "{src}", "--neurons", "0:3"],
        ["amplify-heads", "{src}", "--heads", "0.1", "--alpha", "2"],
        ["apply", "{recipe}", "--model", "{src}"],
    ],
    ids=["prune-neurons", "amplify-heads", "apply"],
)
@pytest.mark.parametrize(
    "options, named",
    [
        (["--dtype", "bfloat16"], "--dtype does not apply; leave it out"),
        (["--device-map", "auto", "--offload-folder", "off"], "--device-map, --offload-folder do not apply"),
    ],
    ids=["dtype", "device-map"],
)
def test_a_gguf_bake_of_named_edits_refuses_loading_options(tmp_path, capsys, command, options, named):
    src, recipe, out = tmp_path / "src.gguf", tmp_path / "recipe.yaml", tmp_path / "out.gguf"
    write_typed_gguf(src, "Q8_0", head_dim=256)
    recipe.write_text("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: 2.0}\n")
    args = [a.format(src=src, recipe=recipe) for a in command]
    code = main_code([*args, "--out", out, *options])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and "is a GGUF file: the bake computes" in err[0] and named in err[0], err
    assert not list(tmp_path.glob("out.gguf*"))
    assert main_code([*args, "--out", out]) == 0 and out.is_file()  # without them it bakes


def test_apply_refuses_a_recipe_without_edits(tiny, tmp_path):
    model = tiny("llama")
    with pytest.raises(RecipeError, match="the recipe has no edits"):
        surgery.apply(Recipe(()), model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_tune_refuses_a_keep_memory_of_its_prompts_that_it_would_not_read(tmp_path):
    missing = tmp_path / "no-model"  # a call the check lets through fails on the model, after it
    with pytest.raises(
        ParameterError,
        match=r"^prompts' keep_memory is not read: .* give params=TuneParams\(keep_memory=8589934592\) \(or keep_memory=8589934592 as a keyword\)",
    ):
        surgery.tune(missing, prompts=surgery.FindParams(keep_memory="8GiB"))
    with pytest.raises(ParameterError, match=r"^prompts' seed, keep_memory are not read"):
        surgery.tune(missing, prompts=surgery.FindParams(keep_memory=0, seed=3), params=surgery.TuneParams(seed=1))
    # the same bound in both, or prompts' at its default, passes the check (then the model is missing)
    same = {"prompts": surgery.FindParams(keep_memory="8GiB"), "params": surgery.TuneParams(keep_memory="8GiB")}
    for call in (same, {"prompts": surgery.FindParams(max_pairs=10), "keep_memory": "8GiB"}):
        with pytest.raises(CheckpointError):
            surgery.tune(missing, **call)
