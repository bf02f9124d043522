"""Exact LoRA export: PeftModel(source, adapter) == baked checkpoint, every architecture, ± --vllm."""

from __future__ import annotations

import json

import pytest
import torch

from surgery.architectures import architecture
from surgery.bake import bake
from surgery.checkpoint import Checkpoint
from surgery.edits import HeadScale, NeuronScale, Recipe
from surgery.errors import RecipeError
from surgery.export import VLLM_RANKS, export_lora

from .conftest import ARCHS


def _recipe(config: dict) -> Recipe:
    g = architecture(config).geometry
    last = g.num_layers - 1
    return Recipe((HeadScale(0, 1, 2.5), HeadScale(0, 3, 0.0), HeadScale(last, g.num_heads - 1, 0.5),
                   NeuronScale(1, 3, 0.0), NeuronScale(last, 5, 1.5)))


def _logits(model) -> torch.Tensor:
    ids = torch.randint(3, 90, (2, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        return model(input_ids=ids).logits


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("vllm", [False, True], ids=["per-module-rank", "vllm"])
@pytest.mark.parametrize("arch", ARCHS)
def test_adapter_equals_baked(tiny, tmp_path, arch, vllm):
    from peft import PeftModel

    src = tiny(arch)
    ckpt = Checkpoint(src)
    recipe = _recipe(ckpt.config)
    bake(ckpt, recipe, tmp_path / "baked")
    summary = export_lora(ckpt, recipe, tmp_path / "adapter", vllm=vllm)

    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    d = architecture(ckpt.config).geometry.head_dim
    if vllm:
        assert cfg["r"] == cfg["lora_alpha"] in VLLM_RANKS and not cfg["rank_pattern"]
        assert set(summary["modules"].values()) == {cfg["r"]}
    else:
        ranks = summary["modules"]
        assert sorted(ranks.values()) == sorted([2 * d, d, 1, 1])  # two heads in layer 0, one elsewhere
        for name, r in ranks.items():
            assert cfg["rank_pattern"].get(name, cfg["r"]) == r == cfg["alpha_pattern"].get(name, cfg["lora_alpha"])

    baked = _logits(_load(tmp_path / "baked"))
    peft_model = PeftModel.from_pretrained(_load(src), tmp_path / "adapter").eval()
    assert (_logits(peft_model) - baked).abs().max().item() <= 1e-5
    merged = peft_model.merge_and_unload()
    assert (_logits(merged) - baked).abs().max().item() <= 1e-5
    assert (_logits(_load(src)) - baked).abs().max().item() > 1e-3  # the edit does something


def test_bf16_source_adapter_matches_baked(tiny, tmp_path):
    from peft import PeftModel

    src = tiny("llama", dtype=torch.bfloat16, shard="20KB")
    ckpt = Checkpoint(src)
    recipe = Recipe((NeuronScale(1, 3, 0.0), HeadScale(2, 0, 2.0)))
    bake(ckpt, recipe, tmp_path / "baked")
    export_lora(ckpt, recipe, tmp_path / "adapter")
    merged = PeftModel.from_pretrained(_load(src), tmp_path / "adapter").merge_and_unload()
    # the baked bf16 weights round α·W once; the adapter holds fp32 factors of the bf16 source
    assert (_logits(merged) - _logits(_load(tmp_path / "baked"))).abs().max().item() <= 0.05


def test_vllm_rank_over_512_is_an_error(tiny, tmp_path):
    src = tiny("llama", intermediate_size=600)
    recipe = Recipe(tuple(NeuronScale(0, i, 0.0) for i in range(513)))
    with pytest.raises(RecipeError, match="512"):
        export_lora(Checkpoint(src), recipe, tmp_path / "adapter", vllm=True)
    assert not (tmp_path / "adapter").exists()


def test_identity_recipe_is_an_error(tiny, tmp_path):
    with pytest.raises(RecipeError, match="changes nothing"):
        export_lora(Checkpoint(tiny("llama")), Recipe((HeadScale(0, 0, 1.0),)), tmp_path / "adapter")
