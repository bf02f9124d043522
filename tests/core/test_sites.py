"""The edit→site map, and the proof that one table row drives hooks, bake and LoRA export alike."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from surgery.bake.bake import bake
from surgery.bake.lora import export_lora
from surgery.bake.verify import verify
from surgery.core import architectures
from surgery.core.architectures import Layout, Mlp, architecture
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import UnsupportedArchitecture
from surgery.core.sites import Site, sites
from surgery.model.hooks import applied, scale_vectors
from tests.support.models import load_fp32, logits, stored_tensors
from tests.support.tiny import BASE, tiny_config

H, I, D = BASE["hidden_size"], BASE["intermediate_size"], BASE["head_dim"]


def _arch(name: str):
    return architecture(tiny_config(name).to_dict())


# --- the map itself ------------------------------------------------------------------------------


def test_head_is_its_o_proj_columns():
    (site,) = sites(_arch("llama"), HeadScale(2, 3, 0.5))
    assert site == Site(2, "self_attn.o_proj", "in", tuple(range(3 * D, 4 * D)), 0.5, (H, 4 * D), True)


@pytest.mark.parametrize("arch", ["llama", "phi3"])
def test_scaled_neuron_is_its_down_proj_column(arch):
    assert sites(_arch(arch), NeuronScale(1, 7, 1.5)) == [Site(1, "mlp.down_proj", "in", (7,), 1.5, (H, I), True)]


def test_pruned_neuron_adds_gate_and_up_rows():
    down, gate, up = sites(_arch("llama"), NeuronScale(1, 7, 0.0))
    assert down == Site(1, "mlp.down_proj", "in", (7,), 0.0, (H, I), True)
    assert gate == Site(1, "mlp.gate_proj", "out", (7,), 0.0, (I, H), False)
    assert up == Site(1, "mlp.up_proj", "out", (7,), 0.0, (I, H), False)


def test_pruned_phi3_neuron_is_both_halves_of_fused_gate_up():
    down, gate_up = sites(_arch("phi3"), NeuronScale(0, 5, 0.0))
    assert down.module == "mlp.down_proj" and down.twin
    assert gate_up == Site(0, "mlp.gate_up_proj", "out", (5, I + 5), 0.0, (2 * I, H), False)


def test_identity_edits_act_nowhere():
    arch = _arch("llama")
    assert sites(arch, HeadScale(0, 0, 1.0)) == sites(arch, NeuronScale(0, 0, 1.0)) == []


def test_only_column_sites_have_twins():
    with pytest.raises(ValueError, match="only input-feature"):
        Site(0, "mlp.up_proj", "out", (1,), 0.0, (I, H), True)


def test_hook_vectors_are_the_twin_sites():
    vectors = scale_vectors(_arch("llama"), [HeadScale(0, 1, 2.0), NeuronScale(0, 4, 0.0), NeuronScale(0, 9, 1.0)])
    assert sorted(vectors) == [("mlp.down_proj", 0), ("self_attn.o_proj", 0)]  # gate/up: bake-only
    assert torch.nonzero(vectors[("mlp.down_proj", 0)] != 1).flatten().tolist() == [4]
    assert torch.nonzero(vectors[("self_attn.o_proj", 0)] != 1).flatten().tolist() == list(range(D, 2 * D))


# --- one new table row is all an architecture needs ------------------------------------------------

# Starcoder2 differs from Llama where it matters: a non-gated MLP named c_fc / c_proj, with biases
# on every linear map (o_proj included), and no head_dim in its config.
STARCODER2 = Layout(mlp=Mlp(down_proj="mlp.c_proj", gate_proj=None, up_proj="mlp.c_fc"))


def _starcoder2(path: Path) -> Path:
    """A seeded tiny Starcoder2 checkpoint, built from its config (no network), as build_tiny does."""
    import transformers as tf

    torch.manual_seed(0)
    config = tf.Starcoder2Config(**{k: v for k, v in BASE.items() if k != "head_dim"})
    model = tf.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(path)
    return path


def _recipe() -> Recipe:
    last = BASE["num_hidden_layers"] - 1
    return Recipe((HeadScale(0, 1, 2.5), NeuronScale(1, 3, 0.0), NeuronScale(last, 5, 1.5)))


@pytest.fixture
def starcoder2(tmp_path) -> Path:
    return _starcoder2(tmp_path / "starcoder2")


def test_without_its_row_every_path_refuses(starcoder2, tmp_path, monkeypatch):
    monkeypatch.delitem(architectures.ARCHITECTURES, "starcoder2")  # the table as it was before its row
    ckpt, recipe = Checkpoint(starcoder2), _recipe()
    with pytest.raises(UnsupportedArchitecture, match="starcoder2"):
        with applied(load_fp32(starcoder2), recipe.edits):
            pass
    with pytest.raises(UnsupportedArchitecture, match="starcoder2"):
        bake(ckpt, recipe, tmp_path / "baked")
    with pytest.raises(UnsupportedArchitecture, match="starcoder2"):
        export_lora(ckpt, recipe, tmp_path / "adapter")
    assert not (tmp_path / "baked").exists() and not (tmp_path / "adapter").exists()


def test_one_row_makes_hooks_bake_and_lora_agree(starcoder2, tmp_path, monkeypatch):
    from peft import PeftModel

    assert architectures.ARCHITECTURES["starcoder2"] == STARCODER2  # the table's row is this one
    monkeypatch.setitem(architectures.ARCHITECTURES, "starcoder2", STARCODER2)
    ckpt, recipe = Checkpoint(starcoder2), _recipe()
    bake(ckpt, recipe, tmp_path / "baked")
    export_lora(ckpt, recipe, tmp_path / "adapter")

    hooked = logits(load_fp32(starcoder2), recipe.edits, seed=3)
    baked = logits(load_fp32(tmp_path / "baked"), seed=3)
    adapted = logits(PeftModel.from_pretrained(load_fp32(starcoder2), tmp_path / "adapter").eval(), seed=3)
    assert (hooked - baked).abs().max().item() <= 1e-5
    assert (adapted - baked).abs().max().item() <= 1e-5
    assert (logits(load_fp32(starcoder2), seed=3) - baked).abs().max().item() > 1e-3  # the recipe does something
    assert verify(ckpt, tmp_path / "baked").ok

    # Exactly the sites' tensors changed (the pruned neuron's c_fc row and bias too); the rest,
    # o_proj and c_proj biases included, is byte-identical.
    before, after = stored_tensors(starcoder2), stored_tensors(tmp_path / "baked")
    edited = {
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.1.mlp.c_proj.weight",
        "model.layers.1.mlp.c_fc.weight",
        "model.layers.1.mlp.c_fc.bias",
        "model.layers.2.mlp.c_proj.weight",
    }
    assert before.keys() == after.keys() and edited <= before.keys()
    assert {n for n in before if not torch.equal(before[n], after[n])} == edited
    assert not after["model.layers.1.mlp.c_fc.weight"][3].any() and after["model.layers.1.mlp.c_fc.bias"][3] == 0
