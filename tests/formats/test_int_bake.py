"""Bakes into int4 / int8 compressed-tensors checkpoints (pack-quantized W4A16 group / tensor,
W8A16 channel, int-quantized int8, asymmetric int4), written offline by compressed-tensors' own
compressors. Exact where exactness exists (checked by decompressing with compressed-tensors),
refused in one line elsewhere; verify, undo byte for byte."""

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
from tests.support.int_packed import build_int, dequantized

O_PROJ = "model.layers.{}.self_attn.o_proj.weight"
DOWN = "model.layers.{}.mlp.down_proj.weight"
GATE = "model.layers.{}.mlp.gate_proj.weight"
SCHEMES = ["w4a16-g8", "w4a16-g8-asym", "w8a16-channel", "int8-channel", "w4a16-tensor"]
HEAD_DIM = 8  # tests/support/tiny.py: a head's o_proj columns are one group of 8


def _bake(src, out, recipe):
    ckpt = Checkpoint(src)
    return bake(ckpt, recipe, out, check=edited_check(ckpt, recipe))


def _head_cols(head: int, alpha: float) -> torch.Tensor:
    s = torch.ones(32)
    s[head * HEAD_DIM : (head + 1) * HEAD_DIM] = alpha
    return s


@pytest.mark.parametrize("scheme", SCHEMES)
def test_pruned_neurons_are_exact_and_undo_restores_the_bytes(tmp_path, scheme):
    src = build_int(tmp_path / "src", scheme)
    aligned = scheme.startswith("w4a16-g8")  # head_dim 8 = the group size: a head is its own scale groups
    recipe = Recipe((NeuronScale(1, 3, 0.0), NeuronScale(1, 40, 0.0), *([HeadScale(2, 1, 0.5)] if aligned else [])))
    out = tmp_path / "out"
    result = _bake(src, out, recipe)
    assert result.provenance.verification.kind == "dequantized weights"
    # decompressed by compressed-tensors: the edit, exactly (a down column shares its words with 7 others)
    down_src, down_out = dequantized(src, DOWN.format(1), scheme), dequantized(out, DOWN.format(1), scheme)
    expected = down_src.clone()
    expected[:, [3, 40]] = 0.0
    assert torch.equal(down_out, expected)
    gate = dequantized(out, GATE.format(1), scheme)
    assert torch.equal(gate[[3, 40]], torch.zeros(2, gate.shape[1]))
    assert torch.equal(gate[[0, 1, 2]], dequantized(src, GATE.format(1), scheme)[[0, 1, 2]])
    if aligned:
        o_src, o_out = dequantized(src, O_PROJ.format(2), scheme), dequantized(out, O_PROJ.format(2), scheme)
        assert torch.equal(o_out, o_src * _head_cols(1, 0.5))
    # every tensor of another module is byte-identical
    a, b = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    edited = (
        "layers.1.mlp.down_proj.",
        "layers.1.mlp.gate_proj.",
        "layers.1.mlp.up_proj.",
        "layers.2.self_attn.o_proj.",
    )
    for name in a:
        if not any(e in name for e in edited):
            assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name
    report = verify(Checkpoint(src), out)
    assert report.ok, report.problems
    assert report.numeric_check.startswith("dequantized")
    # logits too: transformers decompresses symmetric pack-quantized weights, surgery the layouts it cannot run
    assert (Checkpoint(src).format.scheme.not_run is None) == (scheme in ("w4a16-g8", "w8a16-channel", "w4a16-tensor"))
    assert "logits" in report.numeric_check
    assert report.max_abs_logit_diff <= report.tolerance
    undo(out, tmp_path / "restored")
    for f in ("model.safetensors", "config.json"):
        assert file_sha256(tmp_path / "restored" / f) == file_sha256(src / f)


def test_an_aligned_head_scales_its_groups_scales_not_its_codes(tmp_path):
    src = build_int(tmp_path / "src", "w4a16-g8")
    _bake(src, tmp_path / "out", Recipe((HeadScale(0, 1, 2.0),)))
    a, b = load_file(src / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    packed, scale = (O_PROJ.format(0) + "_packed", O_PROJ.format(0).removesuffix("weight") + "weight_scale")
    assert torch.equal(a[packed], b[packed])
    expected = a[scale].clone()
    expected[:, 1] *= 2
    assert torch.equal(b[scale], expected)
    name = O_PROJ.format(0)
    after, before = dequantized(tmp_path / "out", name, "w4a16-g8"), dequantized(src, name, "w4a16-g8")
    assert torch.equal(after, before * _head_cols(1, 2.0))
    edited = json.loads((tmp_path / "out" / "surgery.json").read_text())["edited_tensors"]
    assert [e["tensor"] for e in edited] == [scale]
    undo(tmp_path / "out", tmp_path / "restored")
    assert file_sha256(tmp_path / "restored" / "model.safetensors") == file_sha256(src / "model.safetensors")


def test_a_pruned_down_column_holds_its_zero_point_codes(tmp_path):
    """Asymmetric int4: the pruned column's codes are the zero points (not 0, which would decode to −z·s)."""
    src = build_int(tmp_path / "src", "w4a16-g8-asym")
    _bake(src, tmp_path / "out", Recipe((NeuronScale(0, 5, 0.0),)))
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    t = load_file(tmp_path / "out" / "model.safetensors")
    prefix = DOWN.format(0).removesuffix("weight")
    codes = unpack_from_int32(t[prefix + "weight_packed"], 4, torch.Size([32, 48]))
    zero = unpack_from_int32(t[prefix + "weight_zero_point"], 4, torch.Size([32, 6]), packed_dim=0)
    assert zero[:, 0].abs().sum() > 0  # the test means something: the zero points are not all 0
    assert torch.equal(codes[:, 5], zero[:, 0])


@pytest.mark.parametrize("scheme", ["w4a16-g8", "w4a16-g8-asym", "w8a16-channel", "w4a16-tensor"])
@pytest.mark.parametrize("tamper", ["word", "row"])
def test_the_check_decodes_all_an_edit_can_change(tmp_path, scheme, tamper):
    """The bake's check decodes only what an edit can change, but all of it: another code of a pruned
    column's word (bit 16: int4 column 4, int8 column 2, both in column 3's word), or what a pruned row is
    zeroed by (its scales; per tensor, its codes), changed in the output after the bake, is a problem."""
    src = build_int(tmp_path / "src", scheme)
    recipe = Recipe((NeuronScale(1, 3, 0.0),))
    out = tmp_path / "out"
    _bake(src, out, recipe)
    ckpt = Checkpoint(src)
    assert ckpt.format.check(ckpt, Checkpoint(out), recipe)[1] == []
    tensors = load_file(out / "model.safetensors")
    if tamper == "word":
        tensors[DOWN.format(1) + "_packed"][0, 0] ^= 1 << 16
    elif scheme == "w4a16-tensor":  # one scale: the row's codes hold its zeros
        tensors[GATE.format(1) + "_packed"][3, 0] ^= 1
    else:
        tensors[GATE.format(1).removesuffix("weight") + "weight_scale"][3] = 1.0
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    _, problems = ckpt.format.check(ckpt, Checkpoint(out), recipe)
    edited = DOWN.format(1) if tamper == "word" else GATE.format(1)
    assert len(problems) == 1 and f"'{edited}'" in problems[0]


@pytest.mark.parametrize(
    ("scheme", "alpha", "why"),
    [
        ("w4a16-g8", 0.7, "not exact in BF16"),  # aligned, but 0.7 × a bf16 scale needs more bits
        ("w4a16-g16", 0.5, "not whole scale groups"),  # a head is half a group of 16
        ("w8a16-channel", 2.0, "channel strategy"),  # one scale per row: a column owns none
        ("w4a16-tensor", 2.0, "not whole scale groups"),
    ],
)
def test_a_head_scale_that_is_not_exact_is_refused_in_one_line(tmp_path, scheme, alpha, why):
    src = build_int(tmp_path / "src", scheme)
    with pytest.raises(RecipeError) as err:
        _bake(src, tmp_path / "out", Recipe((HeadScale(0, 1, alpha),)))
    msg = str(err.value)
    assert "\n" not in msg and O_PROJ.format(0) in msg and "layout" in msg and f"{alpha:g}" in msg and why in msg
    # channel and tensor scales span whole rows: they were told to "edit whole scale groups" too
    assert ("edit whole scale groups" in msg) == ("-g" in scheme), msg
    assert not (tmp_path / "out").exists()


def test_a_direction_edit_is_refused(tmp_path):
    from tests.support.directions import direction_recipe

    src = build_int(tmp_path / "src", "w4a16-g8")
    recipe = Recipe.load(direction_recipe(tmp_path / "r", ["layer: 0, module: mlp, weight: 1"]))
    with pytest.raises(RecipeError, match="direction edit"):
        _bake(src, tmp_path / "out", recipe)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("suffix", "bad", "want"),
    [
        ("weight_scale", lambda t: t[:, :3].contiguous(), "[32, 6]"),  # 3 groups for 48 columns of 8
        ("weight_shape", lambda t: torch.tensor([32, 64]), "[32, 64]"),  # 64 columns in 6 words of 8
        ("weight_zero_point", lambda t: t[:2].contiguous(), "[4, 6] I32"),  # zero points of 16 rows for 32
    ],
)
def test_scales_that_contradict_the_weights_are_refused_in_one_line(tmp_path, suffix, bad, want):
    src = build_int(tmp_path / "src", "w4a16-g8-asym")
    tensors = load_file(src / "model.safetensors")
    name = DOWN.format(1).removesuffix("weight") + suffix
    tensors[name] = bad(tensors[name])
    save_file(tensors, src / "model.safetensors")
    with pytest.raises(CheckpointError) as err:
        _bake(src, tmp_path / "out", Recipe((NeuronScale(0, 1, 0.0),)))
    msg = str(err.value)
    assert "\n" not in msg and name in msg and want in msg
    assert not (tmp_path / "out").exists()


def test_other_integer_schemes_are_still_refused(tmp_path):
    """An activation ordering compressed-tensors never wrote and 2-bit codes are not layouts surgery edits:
    one line before reading (GPTQ's actorder weight / group: tests/formats/test_int_gptq_bake.py)."""
    src = build_int(tmp_path / "src", "w4a16-g8")
    config = json.loads((src / "config.json").read_text())
    for change in ({"actorder": "columns"}, {"num_bits": 2}):
        weights = config["quantization_config"]["config_groups"]["group_0"]["weights"]
        (src / "config.json").write_text(
            json.dumps(
                {
                    **config,
                    "quantization_config": {
                        **config["quantization_config"],
                        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {**weights, **change}}},
                    },
                }
            )
        )
        with pytest.raises(CheckpointError, match="quantized"):
            Checkpoint(src)


def test_without_compressed_tensors_the_bake_is_one_line(tmp_path, monkeypatch):
    import sys

    from surgery.core.optional import MissingDependency

    src = build_int(tmp_path / "src", "w4a16-g8")
    for name in [m for m in sys.modules if m.split(".")[0] == "compressed_tensors"]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "compressed_tensors", None)
    with pytest.raises(MissingDependency) as err:
        _bake(src, tmp_path / "out", Recipe((NeuronScale(0, 1, 0.0),)))
    msg = str(err.value)
    assert "\n" not in msg and "compressed-tensors" in msg and "[quant]" in msg
    assert not (tmp_path / "out").exists()
