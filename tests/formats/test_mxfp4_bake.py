"""Bakes into gpt-oss MXFP4 checkpoints (experts as ``X_blocks`` / ``X_scales``, as transformers stores the
gpt-oss release), quantized by compressed-tensors' MXFP4 quantizer: a pruned expert neuron is exact (its gate
and up outputs' codes +0, its down input's codes +0: each weight is its own code), 32 neurons of one expert
scaled by a power of two shift their block's E8M0 scales; each is checked by decoding with transformers;
what cannot be exact is refused in one line; verify, undo byte for byte."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from surgery.bake.bake import bake
from surgery.bake.check import edited_check
from surgery.bake.undo import undo
from surgery.bake.verify import verify
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import RecipeError
from tests.support.mxfp4 import build_mxfp4, dequantized

pytest.importorskip("compressed_tensors")

EXPERTS = "model.layers.{}.mlp.experts.{}"
PRUNED = (NeuronScale(1, 3, 0.0, 1), NeuronScale(2, 15, 0.0, 3), NeuronScale(0, 0, 0.0, 0))
BLOCK = tuple(NeuronScale(1, n, 0.5, 2) for n in range(32, 64))  # expert 2's second block of 32 down inputs


def _bake(src, out, recipe):
    ckpt = Checkpoint(src)
    assert ckpt.format.name == "mxfp4"
    result = bake(ckpt, recipe, out, check=edited_check(ckpt, recipe))
    assert result.provenance.verification.kind == "dequantized weights"


def _expected(src, edits) -> dict[str, torch.Tensor]:
    """The edit of the source decoded by transformers ([experts, in, out]): the neuron's down input × factor;
    pruned, its interleaved gate/up outputs (2n, 2n + 1) and their biases 0."""
    out: dict[str, torch.Tensor] = {}
    for e in edits:
        down = out.setdefault(
            EXPERTS.format(e.layer, "down_proj"), dequantized(src, EXPERTS.format(e.layer, "down_proj"))
        )
        down[e.expert, e.neuron] *= e.factor
        if e.factor == 0.0:
            name = EXPERTS.format(e.layer, "gate_up_proj")
            gate_up = out.setdefault(name, dequantized(src, name))
            gate_up[e.expert, :, 2 * e.neuron : 2 * e.neuron + 2] = 0.0
    return out


@pytest.mark.parametrize("edits", [PRUNED, PRUNED + BLOCK], ids=["pruned", "pruned+block"])
def test_expert_neurons_are_exact_and_undo_restores_the_bytes(tmp_path, edits):
    src = build_mxfp4(tmp_path / "src")
    recipe = Recipe(edits)
    out = tmp_path / "out"
    _bake(src, out, recipe)
    expected = _expected(src, edits)
    for name, values in expected.items():
        assert torch.equal(dequantized(out, name), values), name
    a, b = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        if not any(name.startswith(t) for t in expected):
            assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name
    for e in (e for e in edits if e.factor == 0.0):  # the pruned neuron's biases too (plain bf16)
        bias = b[EXPERTS.format(e.layer, "gate_up_proj_bias")][e.expert, 2 * e.neuron : 2 * e.neuron + 2]
        assert not bias.any()
    if BLOCK[0] in edits:  # a block of 32 inputs scaled by 1/2: its codes untouched, its E8M0 scales − 1
        name = EXPERTS.format(1, "down_proj")
        assert torch.equal(a[name + "_blocks"][2], b[name + "_blocks"][2])
        assert torch.equal(b[name + "_scales"][2, :, 1].int(), a[name + "_scales"][2, :, 1].int() - 1)
    report = verify(Checkpoint(src), out)
    assert report.ok, report.problems
    assert report.numeric_check.startswith("dequantized") and "logits" in report.numeric_check
    undo(out, tmp_path / "restored")
    for f in ("model.safetensors", "config.json"):
        assert file_sha256(tmp_path / "restored" / f) == file_sha256(src / f)


def test_the_plain_attention_beside_the_experts_is_edited_as_floats_and_verified(tmp_path):
    """gpt-oss keeps its attention in bf16: a head scaled by 0.7 is rounded once there, and verify's tolerance
    takes that rounding while the experts load exactly."""
    src = build_mxfp4(tmp_path / "src")
    _bake(src, tmp_path / "out", Recipe((HeadScale(0, 1, 0.7), NeuronScale(1, 3, 0.0, 1))))
    report = verify(Checkpoint(src), tmp_path / "out")
    assert report.ok, report.problems


@pytest.mark.parametrize(
    ("edits", "why"),
    [
        ((NeuronScale(0, 5, 0.5, 1),), "not whole blocks of 32"),  # one down input of a block of 32
        (tuple(NeuronScale(0, n, 0.75, 1) for n in range(32)), "not a power of two"),
        (tuple(NeuronScale(0, n, 2.0**-200, 1) for n in range(32)), "in range"),  # E8M0 below 0
    ],
    ids=["part-of-a-block", "not-a-power-of-two", "out-of-range"],
)
def test_a_scale_that_is_not_exact_is_refused_in_one_line(tmp_path, edits, why):
    src = build_mxfp4(tmp_path / "src")
    with pytest.raises(RecipeError) as err:
        _bake(src, tmp_path / "out", Recipe(edits))
    msg = str(err.value)
    assert "\n" not in msg and "MXFP4" in msg and EXPERTS.format(0, "down_proj_blocks") in msg and why in msg
    assert not (tmp_path / "out").exists()


def test_a_direction_edit_on_the_experts_is_refused(tmp_path):
    from tests.support.directions import direction_recipe

    src = build_mxfp4(tmp_path / "src")
    recipe = Recipe.load(direction_recipe(tmp_path / "r", ["layer: 0, module: experts, weight: 1"]))
    with pytest.raises(RecipeError, match="direction edit.*MXFP4"):
        _bake(src, tmp_path / "out", recipe)
    assert not (tmp_path / "out").exists()
