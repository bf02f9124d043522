"""The bake's default check: each edited weight map, baked vs source + run-time twin, slices only."""

from __future__ import annotations

import json

import pytest
import torch

from surgery.bake.bake import bake
from surgery.bake.check import edited_check, edited_maps
from surgery.bake.verify import verify
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import SurgeryError

RECIPE = Recipe(
    (HeadScale(0, 1, 2.5), HeadScale(1, 3, 0.3), NeuronScale(1, 3, 0.0), NeuronScale(1, 7, 0.0), NeuronScale(0, 5, 0.5))
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_check_passes_within_the_rounding_of_the_stored_dtype(tiny, tmp_path, dtype):
    src = tiny("llama", dtype=dtype, shard="20KB")
    ckpt = Checkpoint(src)
    bake(ckpt, RECIPE, tmp_path / "baked", check=edited_check(ckpt, RECIPE))
    ver = json.loads((tmp_path / "baked" / "surgery.json").read_text())["verification"]
    # o_proj of layers 0 and 1; down_proj of layers 0 and 1; gate and up rows (with biases) of layer 1
    assert ver["maps"] == 6 and ver["kind"] == "edited maps"
    assert ver["max_diff_over_bound"] <= 1.0
    if dtype == torch.float32:  # scaled in float32 and stored as float32: the twin to ~1e-7
        assert ver["max_abs_diff"] <= 1e-5
    else:  # α = 2.5 and 0.3 are not exact in 8 or 11 bits: the check sees the rounding, and allows it
        assert 0 < ver["max_abs_diff"] and ver["max_diff_over_bound"] > 1e-3
    assert verify(ckpt, tmp_path / "baked").ok


def test_check_reads_the_site_map(tiny):
    ckpt = Checkpoint(tiny("llama"))
    maps = {(m.weight, m.axis): m for m in edited_maps(ckpt, RECIPE)}
    down = maps[("model.layers.1.mlp.down_proj.weight", "in")]
    assert down.scales == {3: 0.0, 7: 0.0}
    gate = maps[("model.layers.1.mlp.gate_proj.weight", "out")]
    assert gate.bias == "model.layers.1.mlp.gate_proj.bias" and gate.scales == {3: 0.0, 7: 0.0}
    o_proj = maps[("model.layers.0.self_attn.o_proj.weight", "in")]
    assert set(o_proj.scales.values()) == {2.5} and len(o_proj.scales) == ckpt.config["head_dim"]


@pytest.mark.parametrize(
    "wrong",
    [Recipe((HeadScale(0, 2, 2.5),)), Recipe((HeadScale(0, 1, 2.0),)), Recipe((NeuronScale(1, 3, 0.0),))],
    ids=["other-head", "other-alpha", "rows-left"],
)
def test_a_wrong_slice_is_caught_and_nothing_is_written(tiny, tmp_path, monkeypatch, wrong):
    src = tiny("llama", dtype=torch.bfloat16)
    ckpt = Checkpoint(src)
    recipe = (
        Recipe((HeadScale(0, 1, 2.5),))
        if wrong.edits[0].__class__ is HeadScale
        else Recipe((NeuronScale(1, 3, 0.0), NeuronScale(1, 4, 0.0)))
    )
    stored, real_plan = type(ckpt.format), type(ckpt.format).plan
    # A bake bug: the bytes written are another recipe's (a wrong head, scale, or neuron).
    monkeypatch.setattr(stored, "plan", lambda self, c, arch, edits: real_plan(self, c, arch, wrong.active()))
    with pytest.raises(SurgeryError, match="does not compute the run-time edit"):
        bake(ckpt, recipe, tmp_path / "baked", check=edited_check(ckpt, recipe))
    assert not (tmp_path / "baked").exists() and list(tmp_path.glob(".baked*")) == []
