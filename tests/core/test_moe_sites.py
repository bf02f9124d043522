"""Expert neurons in the edit→site map, the recipe and the one notation (L:eE:N, L:s:N)."""

from __future__ import annotations

import pytest

from surgery.core.architectures import architecture
from surgery.core.edits import SHARED, NeuronScale, Recipe, parse_neurons
from surgery.core.errors import CheckpointError, RecipeError
from surgery.core.sites import Site, sites
from tests.support.tiny import BASE, tiny_config

H = BASE["hidden_size"]


def _arch(name: str, **kw):
    return architecture(tiny_config(name, **kw).to_dict())


def test_notation_round_trips_through_cli_recipe_and_label():
    edits = parse_neurons("28:17, 3:e5:17, 3:s:2", 0.0)
    assert edits == [NeuronScale(28, 17, 0.0), NeuronScale(3, 17, 0.0, 5), NeuronScale(3, 2, 0.0, SHARED)]
    assert [e.label for e in edits] == ["28:17", "3:e5:17", "3:s:2"]
    recipe = Recipe(tuple(edits))
    assert Recipe.from_dict(recipe.to_dict()) == recipe
    assert recipe.to_dict()["edits"][1] == {"type": "neuron", "layer": 3, "expert": 5, "neuron": 17, "factor": 0.0}
    assert recipe.to_dict()["edits"][2]["expert"] == "shared"
    assert "expert" not in recipe.to_dict()["edits"][0]  # dense recipes read and write as before


@pytest.mark.parametrize("spec", ["3:e:1", "3:x5:1", "3:e5:1:2", "3:es:1"])
def test_malformed_expert_notation(spec):
    with pytest.raises(RecipeError, match="LAYER:eEXPERT:NEURON"):
        parse_neurons(spec, 0.0)


def test_same_neuron_of_two_experts_is_no_conflict_but_one_expert_twice_is():
    assert len(Recipe((NeuronScale(1, 2, 0.0, 0), NeuronScale(1, 2, 0.5, 1))).edits) == 2
    with pytest.raises(RecipeError, match="1:e0:2"):
        Recipe((NeuronScale(1, 2, 0.0, 0), NeuronScale(1, 2, 0.5, 0)))


def test_expert_neuron_sites():
    arch = _arch("qwen3_moe")  # experts 16 wide
    down, gate, up = sites(arch, NeuronScale(1, 7, 0.0, 2))
    assert down == Site(1, "mlp.experts.down", "in", (7,), 0.0, (H, 16), True, 2)
    assert gate == Site(1, "mlp.experts.gate", "out", (7,), 0.0, (16, H), False, 2)
    assert up == Site(1, "mlp.experts.up", "out", (7,), 0.0, (16, H), False, 2)
    assert sites(arch, NeuronScale(1, 7, 1.5, 2)) == [
        down.__class__(1, "mlp.experts.down", "in", (7,), 1.5, (H, 16), True, 2)
    ]


def test_shared_expert_neuron_is_a_dense_neuron_of_its_mlp():
    down, gate, up = sites(_arch("qwen2_moe"), NeuronScale(0, 5, 0.0, SHARED))
    assert down == Site(0, "mlp.shared_expert.down_proj", "in", (5,), 0.0, (H, 24), True)
    assert (gate.module, up.module, gate.shape) == ("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj", (24, H))


@pytest.mark.parametrize("fused,part,rows", [(False, "up", (7,)), (True, "gate", (7,)), (True, "up", (16 + 7,))])
def test_expert_rows_in_each_layout(fused, part, rows):
    assert _arch("qwen3_moe").expert_rows(part, 7, fused) == rows


def test_gpt_oss_rows_interleave_and_windows_transpose():
    arch = _arch("gpt_oss")  # 4 experts, intermediate 48
    assert arch.expert_rows("gate", 7, True) == (14,) and arch.expert_rows("up", 7, True) == (15,)
    (down,) = arch.expert_slices(3, "down", True)
    assert down == ("mlp.experts.down_proj", (4, 48, H), 3 * 48, 48, True)
    gate_up, bias = arch.expert_slices(3, "gate", True)
    assert gate_up == ("mlp.experts.gate_up_proj", (4, H, 96), 3 * H, H, True)
    assert bias == ("mlp.experts.gate_up_proj_bias", (4, 96), 3, 1, True)


def test_mixtral_per_expert_names():
    arch = _arch("mixtral")
    assert [s[0] for p in ("gate", "up", "down") for s in arch.expert_slices(5, p, False)] == [
        "block_sparse_moe.experts.5.w1.weight",
        "block_sparse_moe.experts.5.w3.weight",
        "block_sparse_moe.experts.5.w2.weight",
    ]


def test_dense_layers_of_a_sparse_model():
    """Qwen-MoE's mlp_only_layers / decoder_sparse_step: those layers are dense MLPs."""
    arch = _arch("qwen3_moe", mlp_only_layers=[0], decoder_sparse_step=1)
    assert not arch.is_sparse(0) and arch.is_sparse(1) and arch.is_sparse(2)
    Recipe((NeuronScale(0, 47, 0.0),)).validate(tiny_config("qwen3_moe", mlp_only_layers=[0]).to_dict())
    with pytest.raises(RecipeError, match="layer 0 is a dense MLP") as raised:
        Recipe((NeuronScale(0, 1, 0.0, 1),)).validate(tiny_config("qwen3_moe", mlp_only_layers=[0]).to_dict())
    # said "drop 'expert'" (a recipe's field) to a --neurons user too: both spellings are named
    assert "drop the expert (0:1, or a recipe's edit without `expert`)" in str(raised.value)
    assert _arch("qwen2_moe", decoder_sparse_step=2).geometry.sparse_layers == frozenset({1})


def test_dense_geometry_records_as_before():
    assert set(_arch("llama").geometry.to_dict()) == {
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "hidden_size",
        "intermediate_size",
    }
    assert _arch("olmoe").geometry.to_dict()["sparse_layers"] == [0, 1, 2]


def test_layouts_are_told_apart_and_mxfp4_experts_refused():
    arch = _arch("gpt_oss")
    names = {"model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.experts.gate_up_proj"}
    assert arch.fused_experts(names)
    mxfp4 = {
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.experts.gate_up_proj_blocks",
        "model.layers.0.mlp.experts.gate_up_proj_scales",
    }
    with pytest.raises(CheckpointError, match="quantized .*MXFP4.*bf16"):
        arch.fused_experts(mxfp4)
    assert not _arch("mixtral").fused_experts({"model.layers.0.block_sparse_moe.experts.0.w1.weight"})
