"""Layers that differ from config.json's top-level sizes (Gemma 4): full-attention layers with their
own head size and kv heads (transformers' per_layer_config), layers whose values are their keys (no
v_proj), kv-shared layers without k/v projections and with a double-wide MLP. The table derives each
layer's shapes from the config; every consumer (sites, bake, check, twin, LoRA, inspect) reads them
per layer. The sweep proves the default tiny Gemma 4 rows; here, each rule against transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import surgery
from surgery.core.architectures import architecture
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import CheckpointError, RecipeError
from tests.support.cli import error_line, run_main
from tests.support.coverage import GEMMA4, build_family, prove, save_family, table_mismatches
from tests.support.tokenizer import save_char_tokenizer

FULL = ["sliding_attention", "full_attention"] * 3  # 6 layers; full attention in 1, 3, 5

VARIANTS = {
    "plain": dict(attention_k_eq_v=False, num_kv_shared_layers=0, use_double_wide_mlp=False),
    "values are keys": dict(attention_k_eq_v=True, num_kv_shared_layers=0, use_double_wide_mlp=False),
    "kv-shared": dict(attention_k_eq_v=False, num_kv_shared_layers=2, use_double_wide_mlp=False),
    "kv-shared, double-wide": dict(attention_k_eq_v=True, num_kv_shared_layers=3, use_double_wide_mlp=True),
}


def _gemma4(**settings):
    return build_family("gemma4_text", **{**GEMMA4, "num_hidden_layers": 6, "layer_types": FULL, **settings})


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_layer_as_transformers_builds_it(variant):
    with torch.device("meta"):
        model = _gemma4(**VARIANTS[variant])
    arch = architecture(model.config.to_dict())
    assert table_mismatches(model, arch) == []
    settings = VARIANTS[variant]
    shared = settings["num_kv_shared_layers"]
    for layer in range(6):
        g, layout = arch.at(layer).geometry, arch.at(layer).layout
        assert g.head_dim == (32 if FULL[layer] == "full_attention" else 16)
        assert (layout.attention.k_proj is None) == (layer >= 6 - shared)
        assert (layout.attention.v_proj is None) == (
            layer >= 6 - shared or settings["attention_k_eq_v"] and layer % 2 == 1
        )
        assert g.intermediate_size == (192 if settings["use_double_wide_mlp"] and layer >= 6 - shared else 96)


def test_a_head_of_a_wider_layer_and_a_neuron_of_a_wider_mlp(tmp_path):
    """Head 3 of a full-attention layer is o_proj columns 96–127 (head_dim 32), of a sliding one 48–63;
    neuron 191 exists only in a double-wide layer; recipes are checked per layer."""
    model = _gemma4(**VARIANTS["kv-shared, double-wide"])
    arch = architecture(model.config.to_dict())
    (full,) = HeadScale(5, 3, 2.0).sites(arch)
    (sliding,) = HeadScale(0, 3, 2.0).sites(arch)
    assert full.indices == tuple(range(96, 128)) and full.shape == (64, 128)
    assert sliding.indices == tuple(range(48, 64)) and sliding.shape == (64, 64)
    assert NeuronScale(5, 191, 0.0).sites(arch)[0].shape == (64, 192)
    Recipe((NeuronScale(5, 191, 0.0),)).validate(model.config.to_dict())
    with pytest.raises(RecipeError, match="neuron = 191 but the model has intermediate_size = 96"):
        Recipe((NeuronScale(0, 191, 0.0),)).validate(model.config.to_dict())
    info = surgery.inspect(save_family(model, tmp_path / "src"))
    assert all("; residual writers: " in k["summary"] for k in info.layer_kinds)
    assert [k["summary"].split("; residual writers: ")[0] for k in info.layer_kinds] == [
        "layers 0–2: 4 heads; 96 MLP neurons",
        "layers 3–5: 4 heads; 192 MLP neurons",
    ]


def test_layers_with_an_expert_block_beside_the_mlp(tmp_path):
    """Gemma 4's mixture-of-experts variant keeps its dense MLP in every layer, with an expert block
    beside it: heads and dense neurons are edited exactly there, the experts are left as they are."""
    model = _gemma4(
        **VARIANTS["values are keys"], enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32
    )
    assert any("experts" in name for name, _ in model.named_parameters())
    prove(model, tmp_path)


def test_the_finders_refuse_what_they_cannot_see_in_one_line(tmp_path, capsys):
    """find-neurons scores one width per layer and find-heads observes every layer's attention: a
    double-wide MLP, or kv-shared layers (run on the kept positions only), is one line each."""
    src = save_char_tokenizer(save_family(_gemma4(**VARIANTS["kv-shared, double-wide"]), tmp_path / "src"))
    line = error_line(run_main(["find-neurons", src, "--out", tmp_path / "n.json"], capsys))
    assert "MLP widths differ from layer to layer (96 and 192 neurons)" in line and "--neurons" in line
    line = error_line(run_main(["find-heads", src, "--out", tmp_path / "h.json"], capsys))
    assert "layers 3–5 reuse an earlier layer's keys and values" in line and "--heads" in line
    assert not (tmp_path / "n.json").exists() and not (tmp_path / "h.json").exists()


def test_find_neurons_on_uniform_layers(tmp_path):
    """Without double-wide layers, find-neurons scores Gemma 4 like any model (the full-attention
    layers' wider heads do not matter to it)."""
    from tests.support.neuron_pairs import write_pairs

    src = save_char_tokenizer(save_family(_gemma4(**VARIANTS["values are keys"]), tmp_path / "src"))
    found = surgery.find_neurons(src, pairs=write_pairs(tmp_path / "pairs.jsonl"))
    assert all(v.shape == (6, 96) for v in found.scores.bias.values())
    surgery.prune_neurons(src, tmp_path / "pruned", n=4, pairs=write_pairs(tmp_path / "pairs.jsonl"))
    assert surgery.verify(src, tmp_path / "pruned").ok


def _hybrid_with_per_layer_sizes(path, config_sizes: dict) -> Path:
    """A tiny Qwen3.5 text model (layers: linear, full, linear, full attention) whose full-attention layer 3
    has heads of 16 (not 8) and whose linear-attention layer 2 has 64 MLP neurons (not 48): its tensors
    rewritten so, and ``config_sizes`` as config.json's per_layer_config. transformers builds no such
    model; the table, sites, the bake without its run of the source (``verify=False``), its check of the
    edited maps and inspect read config.json and the headers alone."""
    import json

    from safetensors.torch import load_file, save_file

    from tests.support.families import build_family

    src = build_family("qwen3_5_text", path)
    tensors, g = load_file(src / "model.safetensors"), torch.Generator().manual_seed(1)
    wide = {
        "layers.3.self_attn.q_proj": (2 * 4 * 16, 32),
        "layers.3.self_attn.k_proj": (2 * 16, 32),
        "layers.3.self_attn.v_proj": (2 * 16, 32),
        "layers.3.self_attn.o_proj": (32, 4 * 16),
        "layers.2.mlp.gate_proj": (64, 32),
        "layers.2.mlp.up_proj": (64, 32),
        "layers.2.mlp.down_proj": (32, 64),
    }
    for name, shape in wide.items():
        tensors[f"model.{name}.weight"] = torch.randn(shape, generator=g) * 0.1
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "per_layer_config": config_sizes}))
    return src


SIZES_OF_LAYERS = {"3": {"head_dim": 16}, "2": {"intermediate_size": 64}}


def test_per_layer_sizes_and_per_layer_kinds_together(tmp_path):
    """A hybrid model whose layers also differ in size: each edit is checked against its own layer's
    kind and size, resolved at that size, baked there alone; inspect groups the layers by both."""
    from surgery.core.checkpoint import Checkpoint
    from tests.support.models import stored_tensors

    src = _hybrid_with_per_layer_sizes(tmp_path / "src", SIZES_OF_LAYERS)
    config = Checkpoint(src).config
    arch = architecture(config)
    (wide,) = HeadScale(3, 3, 2.0).sites(arch)
    (narrow,) = HeadScale(1, 3, 2.0).sites(arch)
    assert wide.indices == tuple(range(48, 64)) and wide.shape == (32, 64)
    assert narrow.indices == tuple(range(24, 32)) and narrow.shape == (32, 32)
    assert NeuronScale(2, 63, 0.0).sites(arch)[0].shape == (32, 64)
    with pytest.raises(RecipeError, match=r"layer = 2 is a linear_attention layer .* no attention heads"):
        Recipe((HeadScale(2, 0, 2.0),)).validate(config)
    with pytest.raises(RecipeError, match="neuron = 63 but the model has intermediate_size = 48"):
        Recipe((NeuronScale(0, 63, 0.0),)).validate(config)

    refused = "refused: heads of linear attention or a state-space scan (only softmax-attention heads are edited)"
    info = surgery.inspect(src)
    assert all("; residual writers: " in k["summary"] for k in info.layer_kinds)
    assert [k["summary"].split("; residual writers: ")[0] for k in info.layer_kinds] == [
        f"layers 0 (linear_attention): 48 MLP neurons; {refused}",
        "layers 1, 3 (full_attention): 4 heads; 48 MLP neurons",
        f"layers 2 (linear_attention): 64 MLP neurons; {refused}",
    ]

    recipe = Recipe((HeadScale(3, 3, 2.0), NeuronScale(2, 63, 0.0)))
    # transformers builds no such model: a bake that runs the source first refuses it in one line
    with pytest.raises(CheckpointError, match=r"\(AmbiguousGlobalPerLayerAttributeError: 'intermediate_size' is"):
        surgery.apply(recipe, src, tmp_path / "baked")
    assert not (tmp_path / "baked").exists()
    surgery.apply(recipe, src, tmp_path / "baked", bake=surgery.BakeOptions(verify=False))
    before, after = stored_tensors(src), stored_tensors(tmp_path / "baked")
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    o_proj = "model.layers.3.self_attn.o_proj.weight"
    assert {o_proj, "model.layers.2.mlp.down_proj.weight"} <= changed
    assert all(".layers.2.mlp." in n for n in changed - {o_proj})
    o_before, o_after = before[o_proj], after[o_proj]
    assert torch.equal(o_after[:, 48:], 2.0 * o_before[:, 48:]) and torch.equal(o_after[:, :48], o_before[:, :48])
    assert not after["model.layers.2.mlp.down_proj.weight"][:, 63].any()


def test_a_per_layer_size_that_contradicts_the_tensors_is_one_line(tmp_path, capsys):
    """config.json says layer 3's heads are 8 wide, its tensors are 16 wide: inspect and a bake say so in
    one line naming the tensor, and nothing is written."""
    src = _hybrid_with_per_layer_sizes(tmp_path / "src", {"2": {"intermediate_size": 64}})
    line = error_line(run_main(["inspect", src], capsys))
    assert "model.layers.3.self_attn" in line and "head_dim" in line
    line = error_line(
        run_main(["amplify-heads", src, "--heads", "3.1", "--alpha", "2", "--out", tmp_path / "out"], capsys)
    )
    assert "model.layers.3.self_attn" in line and not (tmp_path / "out").exists()
