"""A bake refuses, before publishing anything, a source whose model transformers cannot build or run
(surgery/bake/runnable.py): config.json describes its weights, so inspect and the torch-free bake accept
it, but it names an activation or a RoPE type transformers does not know. Models that load and run
(Llama 4, Gemma 4's per-layer sizes, a mixture of experts) bake as before; a passed run is remembered."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import surgery
import surgery.model.loading
from surgery.bake import runnable
from surgery.core.architectures import architecture
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import CheckpointError
from tests.support.cli import error_line, run_cli, run_main, staging_leftovers, tree_hashes

BROKEN = {
    "activation": {"hidden_act": "bogus"},
    "rope-type": {"rope_parameters": {"rope_type": "bogus", "rope_theta": 10000.0}},
}
REFUSAL = "transformers cannot build a model from {src}/config.json (KeyError: 'bogus')"


def _broken(tiny, change: dict) -> Path:
    src = tiny("llama")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **change}))
    return src


def _command(name: str, src: Path, out: Path) -> list:
    if name == "apply":
        (out.parent / "recipe.yaml").write_text(Recipe((NeuronScale(0, 5, 0.0),)).to_yaml())
        return ["apply", out.parent / "recipe.yaml", "--model", src, "--out", out]
    if name == "prune-neurons":
        return ["prune-neurons", src, "--neurons", "0:5", "--out", out]
    return ["amplify-heads", src, "--heads", "0.1", "--alpha", "2", "--out", out]


@pytest.fixture
def loads(monkeypatch) -> list[Path]:
    """The folders load_model loaded (the run's loader is looked up when it runs)."""
    seen: list[Path] = []
    load = surgery.model.loading.load_model

    def counted(path, *args, **kwargs):
        seen.append(Path(path))
        return load(path, *args, **kwargs)

    monkeypatch.setattr(surgery.model.loading, "load_model", counted)
    return seen


@pytest.mark.parametrize("command", ["prune-neurons", "amplify-heads", "apply"])
@pytest.mark.parametrize("change", BROKEN.values(), ids=BROKEN)
def test_a_bake_of_a_model_transformers_cannot_build_is_one_line_and_publishes_nothing(
    tiny, tmp_path, capsys, command, change
):
    src = _broken(tiny, change)
    assert run_main(["inspect", src], capsys).returncode == 0  # the shapes do check out
    before = tree_hashes(src)
    out = tmp_path / "work" / "out"
    out.parent.mkdir()
    line = error_line(run_main(_command(command, src, out), capsys))
    assert (
        line == "Error: " + REFUSAL.format(src=src) + ": correct that field of the config or re-download the checkpoint"
    )
    assert not out.exists() and not staging_leftovers(out.parent)
    assert tree_hashes(src) == before


@pytest.mark.parametrize("change", BROKEN.values(), ids=BROKEN)
def test_force_over_an_earlier_output_leaves_it_as_it_was(tiny, tmp_path, capsys, change, loads):
    """The earlier output (baked with --no-verify, which runs nothing) stays byte for byte."""
    src = _broken(tiny, change)
    out = tmp_path / "out"
    assert run_main(_command("prune-neurons", src, out) + ["--no-verify"], capsys).returncode == 0
    assert loads == [] and not (runnable.cache_dir() / runnable.FOLDER).exists()
    earlier = tree_hashes(out)
    line = error_line(run_main(_command("amplify-heads", src, out) + ["--force"], capsys))
    assert REFUSAL.format(src=src) in line
    assert tree_hashes(out) == earlier and not staging_leftovers(tmp_path)


def test_python_callers_get_the_project_s_error(tiny, tmp_path):
    src = _broken(tiny, BROKEN["rope-type"])
    recipe = Recipe((HeadScale(0, 1, 2.0),))
    for bake in (surgery.bake_recipe, surgery.apply):
        args = (src, recipe) if bake is surgery.bake_recipe else (recipe, src)
        with pytest.raises(CheckpointError, match=re.escape(REFUSAL.format(src=src))):
            bake(*args, tmp_path / "out")
        assert not (tmp_path / "out").exists()
    surgery.apply(
        recipe, src, tmp_path / "out", bake=surgery.BakeOptions(verify=False)
    )  # the bake alone vouches for no model
    assert (tmp_path / "out" / "surgery.json").is_file()


def test_the_command_in_its_own_process(tiny, tmp_path):
    """As a user runs it: one line, the exit code of a refused input, nothing left behind."""
    src = _broken(tiny, BROKEN["activation"])
    result = run_cli(_command("prune-neurons", src, tmp_path / "out"))
    assert REFUSAL.format(src=src) in error_line(result) and result.returncode == 2
    assert not (tmp_path / "out").exists() and not staging_leftovers(tmp_path)


def _gemma4_per_layer(tmp_path: Path) -> Path:
    """Gemma 4 with full-attention layers of their own head size and kv heads (config.json's
    per_layer_config), as the coverage sweep builds it."""
    from tests.support.coverage import GEMMA4, build_family, save_family

    return save_family(build_family("gemma4_text", **GEMMA4), tmp_path / "gemma4")


@pytest.mark.parametrize("family", ["llama4", "gemma4_text", "qwen3_moe"])
def test_models_that_load_bake_and_the_run_is_remembered(tiny, tmp_path, family, loads):
    """Llama 4 (a multimodal release), Gemma 4's per-layer sizes and a mixture of experts load and run:
    their bakes publish. The run is remembered: a second bake from the source loads nothing."""
    src = _gemma4_per_layer(tmp_path) if family == "gemma4_text" else tiny(family)
    if family == "gemma4_text":
        assert json.loads((src / "config.json").read_text())["per_layer_config"]
    layer = architecture(Checkpoint(src).config).head_layers()[0]
    recipe = Recipe((HeadScale(layer, 1, 2.0),))
    surgery.apply(recipe, src, tmp_path / "first")
    assert loads == [src]
    assert runnable.has_run(runnable.run_key(Checkpoint(src)))
    surgery.apply(recipe, src, tmp_path / "second")
    assert loads == [src]  # remembered
    assert (tmp_path / "second" / "surgery.json").is_file()


def test_what_the_remembered_run_depends_on(tiny, tmp_path, loads):
    """Another config.json (a field changed) or another tokenizer is another key: run again."""
    from tests.support.tokenizer import save_char_tokenizer

    src = tiny("llama")
    recipe = Recipe((HeadScale(0, 1, 2.0),))
    surgery.apply(recipe, src, tmp_path / "a")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    surgery.apply(recipe, src, tmp_path / "b")
    save_char_tokenizer(src)
    surgery.apply(recipe, src, tmp_path / "c")
    surgery.apply(recipe, src, tmp_path / "d")
    assert loads == [src] * 3


def test_no_verify_runs_nothing_and_a_refused_destination_loads_nothing(tiny, tmp_path, capsys, loads):
    src = tiny("llama")
    out = tmp_path / "out"
    assert run_main(_command("amplify-heads", src, out) + ["--no-verify"], capsys).returncode == 0
    assert loads == []
    error_line(run_main(_command("amplify-heads", src, out), capsys))  # exists, no --force
    assert loads == []


def test_weights_that_do_not_fit_are_not_run_and_a_note_says_so(tiny, tmp_path, monkeypatch, loads):
    """The rule: float32 weights up to half the memory available are run, a byte more is not."""
    from surgery.core.sizes import human_size
    from tests.support.models import stored_tensors

    src = _broken(tiny, BROKEN["activation"])
    need = runnable.float32_bytes(Checkpoint(src))
    assert need == 4 * sum(t.numel() for t in stored_tensors(src).values())
    monkeypatch.setattr(runnable, "available_memory", lambda: 2 * need - 1)
    recipe = Recipe((HeadScale(0, 1, 2.0),))
    baked = surgery.apply(recipe, src, tmp_path / "skipped")
    assert loads == [] and (tmp_path / "skipped" / "surgery.json").is_file()
    assert (
        f"the source was not run before publishing: its weights take {human_size(need)} in float32, more than "
        f"50% of the {human_size(2 * need - 1)} of memory available; `surgery verify` runs it"
    ) in baked.notes
    monkeypatch.setattr(runnable, "available_memory", lambda: 2 * need)
    with pytest.raises(CheckpointError, match="transformers cannot build a model"):
        surgery.apply(recipe, src, tmp_path / "run")
    assert loads == [src] and not (tmp_path / "run").exists()
