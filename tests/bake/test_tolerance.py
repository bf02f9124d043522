"""verify's logit tolerance scales with the logits, the depth and the dtype (issue 33, point 3): a
correct direction bake of a deep model with large logits passes, a damaged edited weight fails."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from surgery.bake.bake import bake
from surgery.bake.tolerance import FACTOR
from surgery.bake.verify import numeric, verify
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import Recipe
from tests.support.cli import run_cli, run_main
from tests.support.directions import direction_recipe
from tests.support.tiny import build_tiny

LAYERS = 32
OLD_F32_TOLERANCE = 1e-4  # the fixed float32 tolerance before issue 33


def _deep(folder, gain: float):
    """A 32-layer tiny llama whose output head is scaled by ``gain`` (logits of ~``gain``), and a
    direction ablated from every layer's attention and MLP writers, baked (float32)."""
    from safetensors.torch import load_file, save_file

    src = build_tiny("llama", folder / "src", num_hidden_layers=LAYERS, initializer_range=0.1)
    tensors = load_file(src / "model.safetensors")
    tensors["lm_head.weight"] *= gain
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    entries = [f"layer: {layer}, module: {m}, weight: 1" for layer in range(LAYERS) for m in ("attention", "mlp")]
    recipe = Recipe.load(direction_recipe(folder / "recipe", entries))
    out = folder / "ablated"
    bake(Checkpoint(src), recipe, out)
    return src, recipe, out


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    return _deep(tmp_path_factory.mktemp("deep"), gain=100.0)


def test_a_correct_bake_of_a_deep_model_with_large_logits_passes(deep):
    """The reported case in small: float32 noise over many layers at large logits exceeds the old 1e-4."""
    src, _, out = deep
    report = verify(Checkpoint(src), out)
    assert report.ok, report.problems
    assert report.max_abs_logit_diff > OLD_F32_TOLERANCE  # the old fixed tolerance failed this correct bake
    basis = report.tolerance_basis
    assert (basis.dtype, basis.layers, basis.factor) == ("F32", LAYERS, FACTOR) and basis.max_abs_logit > 50
    assert report.tolerance == pytest.approx(FACTOR * 2.0**-24 * basis.max_abs_logit * LAYERS)


def test_the_tolerance_follows_the_logits_size(tmp_path, deep):
    """Variant: the same model with a tenth of the output head's gain: a tenth of the logits, of the
    float noise and of the tolerance."""
    src, recipe, out = deep
    large_diff, large = numeric(Checkpoint(src), out, recipe)
    src_small, recipe_small, out_small = _deep(tmp_path, gain=10.0)
    small_diff, small = numeric(Checkpoint(src_small), out_small, recipe_small)
    assert small_diff <= small.value and large_diff <= large.value
    ratio = large.max_abs_logit / small.max_abs_logit
    assert ratio == pytest.approx(10, rel=0.01)
    assert large.value / small.value == pytest.approx(ratio)


def _flip(out, name: str, byte: int) -> None:
    """Flip ``byte`` (0: lowest) of the largest-magnitude float32 element of tensor ``name`` in place."""
    from surgery.core.checkpoint import Checkpoint as Ckpt

    info = Ckpt(out, allow_remote_code=True).tensor(name)
    path = out / info.file
    data = bytearray(path.read_bytes())
    values = np.frombuffer(bytes(data[info.start : info.start + 4 * int(np.prod(info.shape))]), np.float32)
    at = info.start + 4 * int(np.abs(values).argmax()) + byte
    data[at] ^= 0x80 if byte == 3 else 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("byte", [3, 2], ids=["sign", "mantissa-high"])
def test_a_flipped_byte_in_an_edited_tensor_fails_the_logit_check(deep, tmp_path, byte):
    """The scaled tolerance still catches damage: one flipped byte of one edited weight moves the logits
    beyond it (the structural check sees it first, by its bytes; the logit check alone sees it too)."""
    src, recipe, baked = deep
    out = tmp_path / "damaged"
    shutil.copytree(baked, out)
    _flip(out, "model.layers.5.mlp.down_proj.weight", byte)
    diff, tol = numeric(Checkpoint(src), out, recipe)
    assert diff > 3 * tol.value, (diff, tol)
    report = verify(Checkpoint(src), out)
    assert not report.ok and "sha256" in report.problems[0]


def test_the_report_states_the_tolerance_and_its_derivation(deep, capsys):
    src, _, out = deep
    as_json = run_main(["verify", src, out, "--json"], capsys)
    report = json.loads(as_json.stdout)
    basis = report["tolerance_basis"]
    assert basis["formula"] == "factor · unit_roundoff · max_abs_logit · layers"
    assert report["tolerance"] == pytest.approx(
        basis["factor"] * basis["unit_roundoff"] * basis["max_abs_logit"] * basis["layers"]
    )
    text = run_main(["verify", src, out], capsys)
    assert text.returncode == 0, text.stderr
    derivation = f"{FACTOR:g} · u(F32) 5.96e-08 · max|logit| {basis['max_abs_logit']:.3g} · {LAYERS} layers"
    assert f"(tolerance {report['tolerance']:.3g} = {derivation})" in " ".join(text.stdout.split())


@pytest.mark.slow(minutes=3)
def test_smollm2_direction_ablation_verifies(smollm2, tmp_path):
    """The reported case on the real model, as README and docs/guides/directions.md show it:
    find-direction on two prompt files, ablate-direction, verify (float32, 30 layers, logits ~30)."""
    (tmp_path / "spanish.txt").write_text(
        "Responde en español: ¿qué hora es?\nEscribe una frase en español sobre el mar\n"
        "Dime en español cómo estás\nHabla en español sobre la comida\n"
    )
    (tmp_path / "english.txt").write_text(
        "What time is it?\nWrite a sentence about the sea\nTell me how you are\nTalk about food\n"
    )
    found = run_cli(
        ["find-direction", smollm2, "--a", tmp_path / "spanish.txt", "--b", tmp_path / "english.txt"]
        + ["--out", tmp_path / "direction.json"],
        timeout=900,
    )
    assert found.returncode == 0, found.stderr
    baked = run_cli(
        ["ablate-direction", smollm2, "--direction", tmp_path / "direction.json", "--out", tmp_path / "ab"], timeout=900
    )
    assert baked.returncode == 0, baked.stderr
    result = run_cli(["verify", smollm2, tmp_path / "ab", "--json"], timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["tolerance_basis"]["layers"] == 30
    assert report["max_abs_logit_diff"] <= report["tolerance"]
