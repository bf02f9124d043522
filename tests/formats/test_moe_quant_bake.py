"""Expert-neuron edits baked into quantized mixtures of experts stored as releases store them: one
tensor per expert (``mlp.experts.{e}.gate_proj.weight`` + its scales), the shared expert as plain
linears, both quantized; the routers left in float. A tiny Qwen2-MoE (4 experts of 16, a shared
expert of 24) in FP8 (whole and partial blocks, per-tensor, per-channel) and int4 W4A16 (group 8, symmetric and not).

Each bake is checked against the edit of the dequantized source (decoded with torch / compressed-
tensors, not surgery), every other tensor byte-identical, ``verify`` (with logits where the model
runs on a CPU) and ``undo`` byte for byte."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from surgery.bake.bake import bake
from surgery.bake.check import edited_check
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import SHARED, NeuronScale, Recipe
from surgery.core.errors import RecipeError
from surgery.formats.fp8.hold import whole_blocks
from tests.support import fp8 as fp8_support
from tests.support import int_packed as int_support
from tests.support.moe_quant import PRUNED, check_expert_bake

ARCH = "qwen2_moe"
MLP = "model.layers.{layer}.mlp.{part}"
# FP8 also scales by a power of two where every product is an e4m3 value (halving: none overflows)
HALVED = (NeuronScale(2, 5, 0.5, 0), NeuronScale(0, 20, 0.5, SHARED))
# blocks of 16: the shared expert's 24 rows end in a partial block (the model loads dequantized by surgery)
FP8 = [("block", (8, 8)), ("block", (16, 16)), ("per-tensor", (8, 8)), ("per-channel", (8, 8))]
IDS = ["block8", "block16-partial", "per-tensor", "per-channel"]
INT = ["w4a16-g8", "w4a16-g8-asym"]


def _bake(src, out, recipe):
    ckpt = Checkpoint(src)
    result = bake(ckpt, recipe, out, check=edited_check(ckpt, recipe))
    assert result.provenance.verification.kind == "dequantized weights"


@pytest.mark.parametrize(("layout", "block"), FP8, ids=IDS)
def test_fp8_expert_and_shared_neurons_are_exact(tmp_path, layout, block):
    src = fp8_support.build_fp8(tmp_path / "src", layout, block, arch=ARCH)
    routers = load_file(src / "model.safetensors")
    assert routers[MLP.format(layer=1, part="gate.weight")].dtype == torch.float32  # left unquantized
    assert routers[MLP.format(layer=1, part="experts.1.gate_proj.weight")].dtype == torch.float8_e4m3fn
    recipe = Recipe(PRUNED + HALVED)
    _bake(src, tmp_path / "out", recipe)

    def dequantized(folder, name):
        return fp8_support.dequantized(folder, name, layout, block)

    check_expert_bake(src, tmp_path / "out", tmp_path, recipe, dequantized)


@pytest.mark.parametrize("scheme", INT)
def test_int4_expert_and_shared_neurons_are_exact(tmp_path, scheme):
    src = int_support.build_int(tmp_path / "src", scheme, arch=ARCH)
    stored = load_file(src / "model.safetensors")
    assert MLP.format(layer=1, part="experts.1.gate_proj.weight_packed") in stored
    assert MLP.format(layer=1, part="shared_expert_gate.weight") in stored  # the routers left unquantized
    recipe = Recipe(PRUNED)
    _bake(src, tmp_path / "out", recipe)

    def dequantized(folder, name):
        return int_support.dequantized(folder, name, scheme)

    # transformers decompresses symmetric pack-quantized experts on a CPU (into fused bf16 experts)
    check_expert_bake(src, tmp_path / "out", tmp_path, recipe, dequantized)


@pytest.mark.parametrize("scheme", INT)
def test_mixtral_int4_expert_neurons_are_exact_and_verified(tmp_path, scheme):
    """Mixtral W4A16 (per-expert w1 / w3 / w2, the router left in float): transformers decompresses the
    symmetric experts on a CPU into fused bf16 experts, so verify compares logits; the run-time twin then
    computes on bfloat16 experts under float32 activations (it crashed in torch's matmul before)."""
    src = int_support.build_int(tmp_path / "src", scheme, arch="mixtral")
    stored = load_file(src / "model.safetensors")
    assert "model.layers.1.block_sparse_moe.experts.1.w2.weight_packed" in stored
    assert stored["model.layers.1.block_sparse_moe.gate.weight"].dtype == torch.bfloat16  # the router, unquantized
    recipe = Recipe((NeuronScale(1, 3, 0.0, 1), NeuronScale(2, 15, 0.0, 3), NeuronScale(0, 40, 0.0, 0)))
    _bake(src, tmp_path / "out", recipe)

    def dequantized(folder, name):
        return int_support.dequantized(folder, name, scheme)

    check_expert_bake(src, tmp_path / "out", tmp_path, recipe, dequantized)


def test_int4_amplified_expert_neuron_is_refused_in_one_line(tmp_path):
    """An expert's down column is never its own scale group, and surgery does not scale int4 codes."""
    src = int_support.build_int(tmp_path / "src", "w4a16-g8", arch=ARCH)
    with pytest.raises(RecipeError) as err:
        _bake(src, tmp_path / "out", Recipe((NeuronScale(1, 3, 2.0, 1),)))
    msg = str(err.value)
    assert "\n" not in msg and "model.layers.1.mlp.experts.1.down_proj.weight_packed" in msg and "by 2" in msg
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("quant", ["fp8-block16-partial", "w4a16-g8"])
def test_deepseek_v3_routed_and_shared_expert_neurons_are_exact(tmp_path, quant):
    """DeepSeek-V3 as its FP8 / W4A16 releases: a dense first layer, ``mlp.shared_experts``, MLA attention
    (kv_a_proj_with_mqa's 20 rows end in a partial block of 16: the model loads dequantized by surgery)."""
    if quant == "w4a16-g8":
        src = int_support.build_int(tmp_path / "src", quant, arch="deepseek_v3")

        def dequantized(folder, name):
            return int_support.dequantized(folder, name, quant)
    else:
        src = fp8_support.build_fp8(tmp_path / "src", "block", (16, 16), arch="deepseek_v3")
        assert not whole_blocks(Checkpoint(src))

        def dequantized(folder, name):
            return fp8_support.dequantized(folder, name, "block", (16, 16))

    recipe = Recipe(PRUNED)
    _bake(src, tmp_path / "out", recipe)
    check_expert_bake(src, tmp_path / "out", tmp_path, recipe, dequantized)
