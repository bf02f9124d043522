"""Bakes into AutoAWQ GEMM checkpoints (int4, zero points, groups of input columns; ``X.qweight`` /
``X.qzeros`` / ``X.scales`` stored transposed), written offline by tests/support/awq.py. Exact where
exactness exists, checked by converting with compressed-tensors' AutoAWQConverter and decompressing with
its own compressor; refused in one line elsewhere and on layouts surgery does not edit; verify, undo byte
for byte."""

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
from surgery.formats.awq import storage as awq
from tests.support.awq import awq_tensors, build_awq, converter, dequantized, quantization_config, quantize

O_PROJ = "model.layers.{}.self_attn.o_proj.weight"
DOWN = "model.layers.{}.mlp.down_proj.weight"
GATE = "model.layers.{}.mlp.gate_proj.weight"
UP = "model.layers.{}.mlp.up_proj.weight"
HEAD_DIM = 8  # tests/support/tiny.py: with groups of 8 a head's o_proj columns are one group


def _bake(src, out, recipe):
    ckpt = Checkpoint(src)
    return bake(ckpt, recipe, out, check=edited_check(ckpt, recipe))


def _part(weight: str, suffix: str) -> str:
    return weight.removesuffix("weight") + suffix


def _untouched(src, out, edited: tuple[str, ...]) -> None:
    """Every tensor of a module outside ``edited`` (name fragments) is byte-identical."""
    a, b = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        if not any(e in name for e in edited):
            assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name


def converter_for(group: int):
    """compressed-tensors' converter of AutoAWQ GEMM int4 weights in groups of ``group``."""
    from compressed_tensors.entrypoints.convert.converters.autoawq import AutoAWQConverter

    return AutoAWQConverter(group_size=group)


def test_the_test_packer_and_surgerys_are_the_converters_inverse():
    """compressed-tensors' AutoAWQConverter gives back the codes, zero points and scales that
    tests/support/awq.py packed (signed: − 8), and surgery's packer writes the same words."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    torch.manual_seed(0)
    codes, zeros, scales = quantize(torch.randn(48, 32), 8)
    assert len(zeros.unique()) > 4  # zero points that differ: a swapped nibble would show
    stored = awq_tensors(codes, zeros, scales)
    out = converter_for(8).process({f"m.{k}": v for k, v in stored.items()})
    assert torch.equal(unpack_from_int32(out["m.weight_packed"], 4, torch.Size([48, 32])).int(), codes - 8)
    zero = unpack_from_int32(out["m.weight_zero_point"], 4, torch.Size([48, 4]), packed_dim=0)
    assert torch.equal(zero.int(), zeros - 8)
    assert torch.equal(out["m.weight_scale"], scales)
    assert torch.equal(torch.from_numpy(awq.pack(codes - 8)), stored["qweight"])
    assert torch.equal(torch.from_numpy(awq.pack(zeros - 8)), stored["qzeros"])


def test_pruned_neurons_and_an_aligned_head_are_exact_and_undo_restores_the_bytes(tmp_path):
    src = build_awq(tmp_path / "src")
    recipe = Recipe((NeuronScale(1, 3, 0.0), NeuronScale(1, 40, 0.0), HeadScale(2, 1, 0.5), HeadScale(0, 2, 2.0)))
    out = tmp_path / "out"
    result = _bake(src, out, recipe)
    assert result.provenance.verification.kind == "dequantized weights"
    # converted and decompressed by compressed-tensors: the edit, exactly
    expected = dequantized(src, DOWN.format(1)).clone()
    expected[:, [3, 40]] = 0.0
    assert torch.equal(dequantized(out, DOWN.format(1)), expected)
    for name in (GATE.format(1), UP.format(1)):
        expected = dequantized(src, name).clone()
        expected[[3, 40]] = 0.0
        assert torch.equal(dequantized(out, name), expected)
    for layer, head, alpha in ((2, 1, 0.5), (0, 2, 2.0)):
        expected = dequantized(src, O_PROJ.format(layer)).clone()
        expected[:, head * HEAD_DIM : (head + 1) * HEAD_DIM] *= alpha
        assert torch.equal(dequantized(out, O_PROJ.format(layer)), expected)
    _untouched(src, out, ("layers.1.mlp.", "layers.2.self_attn.o_proj.", "layers.0.self_attn.o_proj."))
    # which bytes: the down columns' qweight rows, the gate / up rows' scale columns, the heads' scale rows
    edited = {e["tensor"]: e for e in json.loads((out / "surgery.json").read_text())["edited_tensors"]}
    assert edited[_part(DOWN.format(1), "qweight")]["rows"] == [3, 40]
    assert edited[_part(GATE.format(1), "scales")]["cols"] == [3, 40]
    assert edited[_part(O_PROJ.format(2), "scales")]["rows"] == [1]
    assert _part(O_PROJ.format(2), "qweight") not in edited  # a whole group's codes stay as they are
    report = verify(Checkpoint(src), out)
    assert report.ok, report.problems
    assert report.numeric_check.startswith("dequantized weights") and "logits" in report.numeric_check
    assert report.max_abs_logit_diff <= report.tolerance  # both loaded dequantized by surgery (no gptqmodel here)
    undo(out, tmp_path / "restored")
    for f in ("model.safetensors", "config.json"):
        assert file_sha256(tmp_path / "restored" / f) == file_sha256(src / f)


def test_a_pruned_down_column_is_its_groups_zero_points(tmp_path):
    """Input column N of a weight is row N of its qweight, and row N // group of its qzeros holds that
    row's zero points packed the same way: the pruned row is that qzeros row, bit for bit (it decodes to 0)."""
    src = build_awq(tmp_path / "src")
    _bake(src, tmp_path / "out", Recipe((NeuronScale(0, 13, 0.0),)))
    a, b = load_file(src / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    qweight, qzeros = _part(DOWN.format(0), "qweight"), _part(DOWN.format(0), "qzeros")
    assert not torch.equal(a[qweight][13], a[qzeros][13 // 8])  # the test means something
    assert torch.equal(b[qweight][13], a[qzeros][13 // 8])
    others = [r for r in range(48) if r != 13]
    assert torch.equal(b[qweight][others], a[qweight][others])
    assert torch.equal(b[qzeros], a[qzeros])


@pytest.mark.parametrize(
    ("group", "edit", "tensor", "why"),
    [
        (8, HeadScale(0, 1, 0.7), O_PROJ.format(0), "not exact in F16"),  # aligned, but 0.7 × an F16 scale rounds
        (16, HeadScale(0, 1, 0.5), O_PROJ.format(0), "not whole scale groups"),  # a head is half a group of 16
        (8, NeuronScale(0, 5, 2.0), DOWN.format(0), "not whole scale groups"),  # a down column is no group
    ],
)
def test_an_edit_that_is_not_exact_is_refused_in_one_line(tmp_path, group, edit, tensor, why):
    src = build_awq(tmp_path / "src", group=group)
    with pytest.raises(RecipeError) as err:
        _bake(src, tmp_path / "out", Recipe((edit,)))
    msg = str(err.value)
    assert "\n" not in msg and _part(tensor, "qweight") in msg and "AutoAWQ GEMM" in msg and why in msg
    assert f"by {edit.scale:g}" in msg
    assert not (tmp_path / "out").exists()


def test_a_direction_edit_is_refused(tmp_path):
    from tests.support.directions import direction_recipe

    src = build_awq(tmp_path / "src")
    recipe = Recipe.load(direction_recipe(tmp_path / "r", ["layer: 0, module: mlp, weight: 1"]))
    with pytest.raises(RecipeError, match="direction edit") as err:
        _bake(src, tmp_path / "out", recipe)
    assert "\n" not in str(err.value) and "AutoAWQ" in str(err.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"bits": 8}, "quantization_config.bits is 8"),
        ({"version": "gemv"}, "quantization_config.version is 'gemv'"),
        ({"version": "exllama"}, "quantization_config.version is 'exllama'"),
        ({"version": "marlin"}, "quantization_config.version is 'marlin'"),
        ({"version": None, "format": "gemv_fast"}, "quantization_config.version is 'gemv_fast'"),  # transformers 5
        ({"zero_point": False}, "quantization_config.zero_point is false"),
        ({"group_size": -1}, "quantization_config.group_size is -1"),
        ({"modules_to_not_convert": "gate"}, "quantization_config.modules_to_not_convert is 'gate'"),
    ],
)
def test_awq_layouts_surgery_does_not_edit_are_refused_in_one_line(tmp_path, fields, named):
    src = build_awq(tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quantization_config(8, **fields)
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        _bake(src, tmp_path / "out", Recipe((NeuronScale(0, 1, 0.0),)))
    msg = str(err.value)
    assert "\n" not in msg and "AutoAWQ" in msg and named in msg
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("change", "named", "why"),
    [
        (lambda t: t.pop(_part(DOWN.format(1), "qzeros")), _part(DOWN.format(1), "qzeros"), "incomplete"),
        (lambda t: t.pop(_part(DOWN.format(1), "scales")), _part(DOWN.format(1), "scales"), "incomplete"),
        (  # the scales of 3 groups for 48 input rows in groups of 8
            lambda t: t.update({_part(DOWN.format(1), "scales"): t[_part(DOWN.format(1), "scales")][:3].clone()}),
            _part(DOWN.format(1), "scales"),
            "[6, 32]",
        ),
        (  # zero points of 16 output columns for 32
            lambda t: t.update({_part(DOWN.format(1), "qzeros"): t[_part(DOWN.format(1), "qzeros")][:, :2].clone()}),
            _part(DOWN.format(1), "qzeros"),
            "[6, 4]",
        ),
        (  # 44 input rows: not whole groups of 8
            lambda t: t.update({_part(DOWN.format(1), "qweight"): t[_part(DOWN.format(1), "qweight")][:44].clone()}),
            _part(DOWN.format(1), "qweight"),
            "not a multiple of quantization_config.group_size 8",
        ),
    ],
)
def test_awq_tensors_that_do_not_fit_are_refused_in_one_line(tmp_path, change, named, why):
    src = build_awq(tmp_path / "src")
    tensors = load_file(src / "model.safetensors")
    change(tensors)
    save_file(tensors, src / "model.safetensors")
    with pytest.raises(CheckpointError) as err:
        _bake(src, tmp_path / "out", Recipe((NeuronScale(0, 1, 0.0),)))
    msg = str(err.value)
    assert "\n" not in msg and named in msg and why in msg
    assert not (tmp_path / "out").exists()


def test_modules_to_not_convert_are_edited_as_floats(tmp_path):
    """A module modules_to_not_convert names is stored in float: a neuron amplified ×2 scales its float down
    column (refused on AWQ codes) while its pruned sibling's gate / up rows go through their AWQ scales."""
    src = build_awq(tmp_path / "src", unconverted=["layers.1.mlp.down_proj"])
    stored = load_file(src / "model.safetensors")
    assert stored[DOWN.format(1)].dtype == torch.float16 and _part(DOWN.format(0), "qweight") in stored
    recipe = Recipe((NeuronScale(1, 5, 2.0), NeuronScale(1, 6, 0.0)))
    _bake(src, tmp_path / "out", recipe)
    down = dequantized(src, DOWN.format(1)).clone()
    down[:, 5] *= 2.0
    down[:, 6] = 0.0
    assert torch.equal(dequantized(tmp_path / "out", DOWN.format(1)), down)
    gate = dequantized(src, GATE.format(1)).clone()
    gate[6] = 0.0
    assert torch.equal(dequantized(tmp_path / "out", GATE.format(1)), gate)
    assert verify(Checkpoint(src), tmp_path / "out").ok


def test_codes_of_a_module_the_config_leaves_in_float_are_refused_in_one_line(tmp_path):
    """compressed-tensors' converter leaves a module modules_to_not_convert names (a substring of its name)
    unconverted: AWQ codes stored for it contradict the config."""
    src = build_awq(tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"]["modules_to_not_convert"] = ["down_proj"]
    (src / "config.json").write_text(json.dumps(config))
    assert not converter(src)._is_targeted(DOWN.format(0).removesuffix(".weight"))  # the library's reading
    with pytest.raises(CheckpointError) as err:
        _bake(src, tmp_path / "out", Recipe((HeadScale(0, 1, 2.0),)))
    msg = str(err.value)
    assert "\n" not in msg and _part(DOWN.format(0), "qweight") in msg and "modules_to_not_convert" in msg
    assert not (tmp_path / "out").exists()


def test_without_compressed_tensors_the_bake_is_one_line(tmp_path, monkeypatch):
    import sys

    from surgery.core.optional import MissingDependency

    src = build_awq(tmp_path / "src")
    for name in [m for m in sys.modules if m.split(".")[0] == "compressed_tensors"]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "compressed_tensors", None)
    with pytest.raises(MissingDependency) as err:
        _bake(src, tmp_path / "out", Recipe((NeuronScale(0, 1, 0.0),)))
    msg = str(err.value)
    assert "\n" not in msg and "compressed-tensors" in msg and "AutoAWQ" in msg and "[quant]" in msg
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("arch", "recipe"),
    [
        ("qwen2_moe", None),  # routed and shared experts (tests/formats/test_moe_quant_bake.py's PRUNED)
        ("mixtral", Recipe((NeuronScale(1, 3, 0.0, 1), NeuronScale(2, 15, 0.0, 3), NeuronScale(0, 40, 0.0, 0)))),
    ],
)
def test_expert_neurons_of_an_awq_mixture_of_experts_are_exact(tmp_path, arch, recipe):
    """AWQ mixtures of experts as releases store them: one qweight per expert (the architecture table's
    per-expert names), the routers left in float by modules_to_not_convert. Checked against the edit of the
    library's dequantized source, every other tensor byte-identical, verify, undo byte for byte."""
    from tests.support.moe_quant import PRUNED, check_expert_bake

    recipe = recipe or Recipe(PRUNED)
    src = build_awq(tmp_path / "src", arch=arch)
    stored = load_file(src / "model.safetensors")
    router = "model.layers.1.mlp.gate.weight" if arch == "qwen2_moe" else "model.layers.1.block_sparse_moe.gate.weight"
    assert stored[router].dtype == torch.float16  # left unquantized
    expert = "mlp.experts.1.down_proj" if arch == "qwen2_moe" else "block_sparse_moe.experts.1.w2"
    assert f"model.layers.1.{expert}.qweight" in stored
    _bake(src, tmp_path / "out", recipe)
    check_expert_bake(src, tmp_path / "out", tmp_path, recipe, dequantized)
