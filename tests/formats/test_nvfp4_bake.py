"""Bakes into NVFP4 compressed-tensors checkpoints (``nvfp4-pack-quantized``), written offline by
compressed-tensors' own NVFP4 compressor: a tiny Llama and a tiny Qwen3-MoE (experts one tensor each).
Pruning is exact (codes +0, a down column too: each weight is its own code), a power of two on whole
rows or whole groups of 16 columns goes through the e4m3 scales; each is checked by decompressing with
compressed-tensors; what cannot be exact is refused in one line; verify, undo byte for byte."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from surgery.bake.bake import bake
from surgery.bake.check import edited_check
from surgery.bake.undo import undo
from surgery.bake.verify import verify
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import CheckpointError, RecipeError
from tests.support.moe_quant import check_expert_bake
from tests.support.nvfp4 import build_nvfp4, dequantized

pytest.importorskip("compressed_tensors")

O_PROJ = "model.layers.{}.self_attn.o_proj.weight"
DOWN = "model.layers.{}.mlp.down_proj.weight"
GATE = "model.layers.{}.mlp.gate_proj.weight"
WIDE_HEADS = {"head_dim": 16}  # a head's o_proj columns are one group of 16


def _bake(src, out, recipe):
    ckpt = Checkpoint(src)
    result = bake(ckpt, recipe, out, check=edited_check(ckpt, recipe))
    assert result.provenance.verification.kind == "dequantized weights"
    return result


def _untouched(src, out, edited: tuple[str, ...]) -> None:
    a, b = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        if not any(e in name for e in edited):
            assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name


@pytest.mark.parametrize("sizes", [{}, WIDE_HEADS], ids=["head8", "head16"])
def test_pruned_neurons_and_heads_are_exact_and_undo_restores_the_bytes(tmp_path, sizes):
    src = build_nvfp4(tmp_path / "src", **sizes)
    assert Checkpoint(src).format.name == "nvfp4"
    heads = (HeadScale(2, 1, 0.0), *([HeadScale(0, 1, 0.5)] if sizes else []))  # halving: whole groups of 16
    recipe = Recipe((NeuronScale(1, 3, 0.0), NeuronScale(1, 40, 0.0), *heads))
    out = tmp_path / "out"
    _bake(src, out, recipe)
    down_src, down_out = dequantized(src, DOWN.format(1)), dequantized(out, DOWN.format(1))
    expected = down_src.clone()
    expected[:, [3, 40]] = 0.0  # column 3 shares its bytes with column 2, column 40 with 41
    assert torch.equal(down_out, expected)
    gate = dequantized(out, GATE.format(1))
    assert torch.equal(gate[[3, 40]], torch.zeros(2, gate.shape[1]))
    assert torch.equal(gate[[0, 1, 2]], dequantized(src, GATE.format(1))[[0, 1, 2]])
    width = sizes.get("head_dim", 8)
    head = slice(width, 2 * width)
    o_src, o_out = dequantized(src, O_PROJ.format(2)), dequantized(out, O_PROJ.format(2))
    want = o_src.clone()
    want[:, head] = 0.0
    assert torch.equal(o_out, want)
    edited = [
        "layers.1.mlp.down_proj.",
        "layers.1.mlp.gate_proj.",
        "layers.1.mlp.up_proj.",
        "layers.2.self_attn.o_proj.",
    ]
    if sizes:
        o_src, o_out = dequantized(src, O_PROJ.format(0)), dequantized(out, O_PROJ.format(0))
        want = o_src.clone()
        want[:, head] *= 0.5
        assert torch.equal(o_out, want)
        edited.append("layers.0.self_attn.o_proj.")
    _untouched(src, out, tuple(edited))
    report = verify(Checkpoint(src), out)
    assert report.ok, report.problems
    assert report.numeric_check.startswith("dequantized") and "logits" in report.numeric_check
    assert report.max_abs_logit_diff <= report.tolerance
    undo(out, tmp_path / "restored")
    for f in ("model.safetensors", "config.json"):
        assert file_sha256(tmp_path / "restored" / f) == file_sha256(src / f)


def test_a_pruned_row_writes_positive_zero_codes_and_a_halved_head_only_scales(tmp_path):
    """Pruned: the row's bytes are 0 (+0 codes), its scales kept; a halved aligned head: its groups' e4m3
    scales halved, its codes untouched."""
    src = build_nvfp4(tmp_path / "src", **WIDE_HEADS)
    _bake(src, tmp_path / "out", Recipe((NeuronScale(0, 7, 0.0), HeadScale(0, 1, 0.5))))
    a, b = load_file(src / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    gate = GATE.format(0) + "_packed"
    assert torch.equal(b[gate][7], torch.zeros_like(b[gate][7])) and a[gate][7].any()
    scale = GATE.format(0).removesuffix("weight") + "weight_scale"
    assert torch.equal(a[scale].view(torch.uint8), b[scale].view(torch.uint8))
    o_packed, o_scale = O_PROJ.format(0) + "_packed", O_PROJ.format(0).removesuffix("weight") + "weight_scale"
    assert torch.equal(a[o_packed], b[o_packed])
    expected = a[o_scale].float()
    expected[:, 1] *= 0.5
    assert torch.equal(b[o_scale].float(), expected)


@pytest.mark.parametrize(
    ("sizes", "edit", "why"),
    [
        ({}, HeadScale(0, 1, 0.5), "not whole groups of 16"),  # head_dim 8: half a group
        (WIDE_HEADS, HeadScale(0, 1, 0.7), "not e4m3 values"),  # 0.7 × an e4m3 scale needs more bits
        # ×2 on the group holding the tensor's largest weight: its scale is e4m3's 448 (the global scale's aim)
        (WIDE_HEADS, HeadScale(0, 0, 2.0), "pass 448"),
        ({}, NeuronScale(0, 5, 0.5), "not whole groups of 16"),  # a down column is one of 16
    ],
    ids=["half-group", "not-a-power-of-two", "overflow", "down-column"],
)
def test_a_scale_that_is_not_exact_is_refused_in_one_line(tmp_path, sizes, edit, why):
    src = build_nvfp4(tmp_path / "src", **sizes)
    alpha = edit.alpha if isinstance(edit, HeadScale) else edit.factor
    if alpha == 2.0:  # the 448 scale of this weight is in the edited head's columns, or the test moves on
        scales = load_file(src / "model.safetensors")[O_PROJ.format(0).removesuffix("weight") + "weight_scale"]
        assert scales.float()[:, 0].max() * 2 > 448
    with pytest.raises(RecipeError) as err:
        _bake(src, tmp_path / "out", Recipe((edit,)))
    msg = str(err.value)
    assert "\n" not in msg and "NVFP4" in msg and why in msg and f"{alpha:g}" in msg
    assert not (tmp_path / "out").exists()


def test_a_direction_edit_is_refused(tmp_path):
    from tests.support.directions import direction_recipe

    src = build_nvfp4(tmp_path / "src")
    recipe = Recipe.load(direction_recipe(tmp_path / "r", ["layer: 0, module: mlp, weight: 1"]))
    with pytest.raises(RecipeError, match="direction edit.*NVFP4"):
        _bake(src, tmp_path / "out", recipe)
    assert not (tmp_path / "out").exists()


def test_scales_that_contradict_the_weights_are_refused_in_one_line(tmp_path):
    src = build_nvfp4(tmp_path / "src")
    tensors = load_file(src / "model.safetensors")
    name = DOWN.format(1).removesuffix("weight") + "weight_scale"
    tensors[name] = tensors[name][:, :2].contiguous()  # 2 groups for 48 columns
    save_file(tensors, src / "model.safetensors")
    with pytest.raises(CheckpointError) as err:
        _bake(src, tmp_path / "out", Recipe((NeuronScale(0, 1, 0.0),)))
    msg = str(err.value)
    assert "\n" not in msg and name in msg and "[32, 3]" in msg
    assert not (tmp_path / "out").exists()


def test_an_nvfp4_variant_surgery_does_not_edit_is_refused_in_one_line(tmp_path):
    src = build_nvfp4(tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 32
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        Checkpoint(src)
    msg = str(err.value)
    assert "\n" not in msg and "NVFP4" in msg and "groups of 16" in msg


def test_qwen3_moe_expert_neurons_are_exact(tmp_path):
    """Experts stored one tensor each, quantized by compressed-tensors; routers in float and untouched."""
    src = build_nvfp4(tmp_path / "src", arch="qwen3_moe")
    stored = load_file(src / "model.safetensors")
    assert stored["model.layers.1.mlp.gate.weight"].dtype == torch.bfloat16
    assert stored["model.layers.1.mlp.experts.1.gate_proj.weight_packed"].dtype == torch.uint8
    recipe = Recipe((NeuronScale(1, 3, 0.0, 1), NeuronScale(2, 15, 0.0, 3), NeuronScale(0, 0, 0.0, 0)))
    _bake(src, tmp_path / "out", recipe)
    check_expert_bake(src, tmp_path / "out", tmp_path, recipe, dequantized)


def test_the_commands_end_to_end(tmp_path, capsys):
    """prune-neurons, verify and undo as a user runs them; an inexact head α is one ``Error:`` line."""
    from tests.support.cli import run_main

    src = build_nvfp4(tmp_path / "src")
    out, back = tmp_path / "pruned", tmp_path / "back"
    done = run_main(["prune-neurons", src, "--neurons", "0:3,1:7", "--out", out, "--json"], capsys)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verification"]["kind"] == "dequantized weights"
    assert run_main(["verify", src, out], capsys).returncode == 0
    assert run_main(["undo", out, "--out", back], capsys).returncode == 0
    assert file_sha256(back / "model.safetensors") == file_sha256(src / "model.safetensors")
    failed = run_main(["amplify-heads", src, "--heads", "0.1", "--alpha", "0.5", "--out", tmp_path / "h"], capsys)
    errors = [ln for ln in failed.stderr.splitlines() if ln.startswith("Error: ")]
    assert failed.returncode != 0 and len(errors) == 1 and "not whole groups of 16" in errors[0]
    assert not (tmp_path / "h").exists()
