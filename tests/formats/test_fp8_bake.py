"""Bakes into FP8 (e4m3) checkpoints: block scales (DeepSeek / Qwen FP8) and compressed-tensors'
per-tensor and per-channel scales. Exact where exactness exists (checked by dequantizing with
torch), refused in one line elsewhere; verify, undo byte for byte."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from surgery.bake.bake import bake
from surgery.bake.check import edited_check
from surgery.bake.undo import undo
from surgery.bake.verify import verify
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import CheckpointError, RecipeError
from tests.support.fp8 import build_fp8, dequantized

O_PROJ = "model.layers.{}.self_attn.o_proj.weight"
DOWN = "model.layers.{}.mlp.down_proj.weight"
GATE = "model.layers.{}.mlp.gate_proj.weight"
LAYOUTS = [("block", (8, 8)), ("block", (128, 128)), ("per-tensor", (8, 8)), ("per-channel", (8, 8))]
IDS = ["block8-aligned", "block128-unaligned", "per-tensor", "per-channel"]
HEAD_DIM = 8


def _bake(src, out, recipe):
    ckpt = Checkpoint(src)
    return bake(ckpt, recipe, out, check=edited_check(ckpt, recipe))


@pytest.mark.parametrize(("layout", "block"), LAYOUTS, ids=IDS)
def test_pruned_neurons_and_halved_head_are_exact(tmp_path, layout, block):
    src = build_fp8(tmp_path / "src", layout, block)
    recipe = Recipe((NeuronScale(1, 3, 0.0), NeuronScale(1, 40, 0.0), HeadScale(2, 1, 0.5)))
    result = _bake(src, tmp_path / "out", recipe)
    assert result.provenance.verification.kind == "dequantized weights"
    out = tmp_path / "out"
    # dequantized with torch's own float8_e4m3fn: the edit, exactly
    for name, cols, alpha in ((DOWN.format(1), [3, 40], 0.0), (O_PROJ.format(2), range(8, 16), 0.5)):
        before, after = dequantized(src, name, layout, block), dequantized(out, name, layout, block)
        expected = before.clone()
        expected[:, list(cols)] *= alpha
        assert torch.equal(after, expected), name
    gate = dequantized(out, GATE.format(1), layout, block)
    assert torch.equal(gate[[3, 40]], torch.zeros(2, gate.shape[1]))
    assert (load_file(out / "model.safetensors")[GATE.format(1)].view(torch.uint8)[[3, 40]] == 0).all()
    # every tensor the recipe does not touch is byte-identical
    a, b = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    edited = {DOWN.format(1), GATE.format(1), GATE.format(1).replace("gate", "up"), O_PROJ.format(2)}
    edited |= {n.removesuffix("weight") + s for n in edited for s in ("weight_scale_inv", "weight_scale")}
    edited |= {"model.layers.1.mlp.gate_proj.bias", "model.layers.1.mlp.up_proj.bias"}
    for name in a:
        if name not in edited:
            assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name
    report = verify(Checkpoint(src), out)
    assert report.ok, report.problems
    assert report.numeric_check.startswith("dequantized")
    assert "logits" in report.numeric_check and report.max_abs_logit_diff <= report.tolerance  # FP8 runs dequantized
    undo(out, tmp_path / "restored")
    for f in ("model.safetensors", "config.json"):
        assert file_sha256(tmp_path / "restored" / f) == file_sha256(src / f)


def test_aligned_head_scales_its_blocks_scales_not_its_bytes(tmp_path):
    src = build_fp8(tmp_path / "src", "block", (8, 8))
    _bake(src, tmp_path / "out", Recipe((HeadScale(0, 1, 2.0),)))
    a, b = load_file(src / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    name = O_PROJ.format(0)
    assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8))
    scale = name.removesuffix("weight") + "weight_scale_inv"
    expected = a[scale].clone()
    expected[:, 1] *= 2
    assert torch.equal(b[scale], expected)
    assert torch.equal(dequantized(tmp_path / "out", name, "block"), dequantized(src, name, "block") * _cols(1, 2.0))
    edited = json.loads((tmp_path / "out" / "surgery.json").read_text())["edited_tensors"]
    assert sorted(e["tensor"] for e in edited) == [scale]
    undo(tmp_path / "out", tmp_path / "restored")
    assert file_sha256(tmp_path / "restored" / "model.safetensors") == file_sha256(src / "model.safetensors")


def _cols(head: int, alpha: float) -> torch.Tensor:
    s = torch.ones(32)
    s[head * HEAD_DIM : (head + 1) * HEAD_DIM] = alpha
    return s


@pytest.mark.parametrize(("layout", "block"), LAYOUTS, ids=IDS)
def test_a_scale_that_is_not_exact_is_refused_in_one_line(tmp_path, layout, block):
    src = build_fp8(tmp_path / "src", layout, block)
    with pytest.raises(RecipeError) as err:
        _bake(src, tmp_path / "out", Recipe((HeadScale(0, 1, 0.7),)))
    msg = str(err.value)
    assert "\n" not in msg and O_PROJ.format(0) in msg and "FP8 layout" in msg and "0.7" in msg
    # a layout without scale blocks (per-channel, per-tensor) was told to "edit whole scale blocks"
    assert ("edit whole scale blocks" in msg) == (layout == "block"), msg
    assert not (tmp_path / "out").exists()


def test_doubling_the_largest_weight_overflows_and_is_refused(tmp_path):
    src = build_fp8(tmp_path / "src", "per-tensor")
    w = load_file(src / "model.safetensors")[O_PROJ.format(0)].float()
    head = int(w.abs().amax(dim=0).argmax()) // HEAD_DIM  # the head holding 448, the largest e4m3
    with pytest.raises(RecipeError, match="overflow e4m3"):
        _bake(src, tmp_path / "out", Recipe((HeadScale(0, head, 2.0),)))
    assert not (tmp_path / "out").exists()


def test_a_direction_edit_is_refused(tmp_path):
    from tests.support.directions import direction_recipe

    src = build_fp8(tmp_path / "src", "block")
    recipe = Recipe.load(direction_recipe(tmp_path / "r", ["layer: 0, module: mlp, weight: 1"]))
    with pytest.raises(RecipeError, match="direction edit"):
        _bake(src, tmp_path / "out", recipe)


def test_scales_that_contradict_the_weights_are_refused_in_one_line(tmp_path):
    from safetensors.torch import save_file

    src = build_fp8(tmp_path / "src", "block", (8, 8))
    tensors = load_file(src / "model.safetensors")
    scale = O_PROJ.format(1).removesuffix("weight") + "weight_scale_inv"
    tensors[scale] = tensors[scale][:, :3].contiguous()  # 3 column blocks for 32 columns of 8
    save_file(tensors, src / "model.safetensors")
    with pytest.raises(CheckpointError) as err:
        _bake(src, tmp_path / "out", Recipe((NeuronScale(0, 1, 0.0),)))
    msg = str(err.value)
    assert "\n" not in msg and scale in msg and "[4, 3]" in msg and "[4, 4]" in msg
    assert not (tmp_path / "out").exists()


def test_other_quantizations_are_still_refused(tmp_path):
    src = build_fp8(tmp_path / "src", "block")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="quantized"):
        Checkpoint(src)


def test_requantize_on_a_quantized_folder_says_what_the_bake_does_instead(tmp_path, capsys):
    """It said "a safetensors bake rounds to the stored dtype": an FP8 (or int) checkpoint's bake refuses
    an inexact edit instead, which is why --requantize was asked for."""
    from tests.support.cli import error_line, run_main

    src = build_fp8(tmp_path / "src", "per-channel")
    (tmp_path / "r.yaml").write_text(Recipe((HeadScale(0, 1, 0.7),)).to_yaml())
    args = ["apply", tmp_path / "r.yaml", "--model", src, "--out", tmp_path / "out", "--requantize"]
    line = error_line(run_main(args, capsys))
    assert "applies to GGUF models only" in line and "refuses an edit its quantized weights cannot hold exactly" in line
    assert not (tmp_path / "out").exists()
