"""The registry of edit kinds: a kind registered by a test alone goes through every path.

The toy kind below lives only in this file. Registering it is all it takes for a recipe entry of
its type to be parsed, validated, baked, checked by the bake, verified against its run-time twin,
undone byte for byte and exported as an exact LoRA adapter, and for its row to reach the model card.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from surgery.bake.bake import bake
from surgery.bake.card import card_hook
from surgery.bake.check import edited_check
from surgery.bake.lora import export_lora
from surgery.bake.undo import undo
from surgery.bake.verify import verify
from surgery.core.architectures import Architecture
from surgery.core.checkpoint import Checkpoint
from surgery.core.edit_kind import (
    Edit,
    check_layer,
    check_scale,
    edit_kinds,
    index,
    number,
    recipe_key,
    register_edit_kind,
    unregister_edit_kind,
)
from surgery.core.edits import DirectionEdit, HeadScale, NeuronScale, Recipe, SteerEdit
from surgery.core.errors import RecipeError
from surgery.core.sites import Site
from tests.support.models import load_fp32, logits, stored_tensors


@dataclass(frozen=True)
class LayerAttentionScale(Edit):
    """Scale every head of one layer by ``alpha``: all input columns of its attention output."""

    kind: ClassVar[str] = "layer_attention"

    layer: int = recipe_key(index)
    alpha: float = recipe_key(number)

    @property
    def target(self):
        return (self.kind, self.layer)

    @property
    def label(self) -> str:
        return f"layer {self.layer}"

    @property
    def setting(self) -> str:
        return f"α = {self.alpha}"

    def is_identity(self) -> bool:
        return self.alpha == 1.0

    def validate(self, arch: Architecture, where: str) -> None:
        check_scale(self.alpha, where)
        check_layer(arch, self.layer, where)

    def sites(self, arch: Architecture) -> list[Site]:
        o_proj = arch.layout.attention.o_proj
        shape, _ = arch.attention_shapes()[o_proj]
        return [Site(self.layer, o_proj, "in", tuple(range(shape[1])), self.alpha, shape, True)]

    def card_row(self, where: str):
        return ("whole attention layer", str(self.layer), "all heads", f"α = {self.alpha:g}", where)

    def card_tags(self):
        return ("attention-layers",)


@dataclass(frozen=True)
class NoAdapterScale(LayerAttentionScale):
    """The same edit, declared to have no exact adapter: export-lora must refuse it in one line."""

    kind: ClassVar[str] = "no_adapter"

    def lora_refusal(self, arch: Architecture) -> str | None:
        return "this toy kind declares no adapter"


@pytest.fixture
def toy_kinds():
    register_edit_kind(LayerAttentionScale)
    register_edit_kind(NoAdapterScale)
    yield
    unregister_edit_kind(LayerAttentionScale.kind)
    unregister_edit_kind(NoAdapterScale.kind)


def _sha256s(folder) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_builtin_kinds_are_registered():
    assert edit_kinds() == {"head": HeadScale, "neuron": NeuronScale, "direction": DirectionEdit, "steer": SteerEdit}


def test_a_kind_registered_in_a_test_goes_through_every_path(toy_kinds, tiny, tmp_path):
    from peft import PeftModel

    src = tiny("llama")
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "version: 1\nedits:\n  - {type: layer_attention, layer: 1, alpha: 0.5}\n"
        "  - {type: neuron, layer: 0, neuron: 3, factor: 0}\n"
    )
    recipe = Recipe.load(path)
    assert recipe.edits == (LayerAttentionScale(1, 0.5), NeuronScale(0, 3, 0.0))
    assert Recipe.from_dict(recipe.to_dict()) == recipe  # to_dict / from_dict round trip

    ckpt = Checkpoint(src)
    result = bake(ckpt, recipe, tmp_path / "baked", check=edited_check(ckpt, recipe), card=card_hook())
    assert result.provenance.verification.maps == 4  # o_proj columns; down column; gate, up rows
    card = (tmp_path / "baked" / "README.md").read_text()
    assert "| whole attention layer | 1 | all heads | α = 0.5 |" in card and "attention-layers" in card

    # Baked == run-time twin (hooks), and only the sites' tensors changed.
    twin = logits(load_fp32(src), recipe.edits)
    baked = logits(load_fp32(tmp_path / "baked"))
    assert (twin - baked).abs().max().item() <= 1e-5
    assert (logits(load_fp32(src)) - baked).abs().max().item() > 1e-3
    before, after = stored_tensors(src), stored_tensors(tmp_path / "baked")
    assert {n for n in before if not torch.equal(before[n], after[n])} == {
        "model.layers.1.self_attn.o_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.gate_proj.bias",
        "model.layers.0.mlp.up_proj.bias",
    }  # the tiny Llama has MLP biases

    assert verify(ckpt, tmp_path / "baked").ok
    undo(tmp_path / "baked", tmp_path / "restored")
    assert _sha256s(tmp_path / "restored") == _sha256s(src)

    export_lora(ckpt, recipe, tmp_path / "adapter")
    adapted = logits(PeftModel.from_pretrained(load_fp32(src), tmp_path / "adapter").eval())
    assert (adapted - baked).abs().max().item() <= 1e-5


def test_a_kind_can_refuse_the_adapter_in_one_line(toy_kinds, tiny, tmp_path):
    src = tiny("llama")
    recipe = Recipe((NoAdapterScale(0, 2.0),))
    with pytest.raises(RecipeError, match="no_adapter layer 0: this toy kind declares no adapter"):
        export_lora(Checkpoint(src), recipe, tmp_path / "adapter")
    assert not (tmp_path / "adapter").exists()


def test_recipe_keys_of_a_registered_kind_are_strict(toy_kinds):
    with pytest.raises(RecipeError, match=r"unknown key head \(allowed: type, layer, alpha\)"):
        Recipe.from_dict({"version": 1, "edits": [{"type": "layer_attention", "layer": 0, "alpha": 2, "head": 1}]})
    with pytest.raises(RecipeError, match="edits.0..alpha must be a finite number"):
        Recipe.from_dict({"version": 1, "edits": [{"type": "layer_attention", "layer": 0, "alpha": float("nan")}]})
    with pytest.raises(
        RecipeError, match="'direction' or 'head' or 'layer_attention' or 'neuron' or 'no_adapter' or 'steer'"
    ):
        Recipe.from_dict({"version": 1, "edits": [{"type": "rotate", "layer": 0}]})


def test_kinds_are_checked_when_registered():
    class NotADataclass(Edit):
        kind = "nope"

    with pytest.raises(TypeError, match="dataclass"):
        register_edit_kind(NotADataclass)
    with pytest.raises(ValueError, match="already registered"):
        register_edit_kind(dataclass(frozen=True)(type("Other", (HeadScale,), {"kind": "head"})))
