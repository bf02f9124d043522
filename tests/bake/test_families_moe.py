"""Every mixture-of-experts family of issue 24, proven on a tiny random model of its own config class.

For each family: routed-expert neurons (pruned and scaled), shared-expert neurons, dense-layer
neurons and heads where the family has them, in one recipe. The baked checkpoint computes the
run-time twin (fp32 logits within 1e-5; the routed edits alone move the logits, so the twin is not
vacuous), every tensor the bake did not edit is byte-identical, names/shapes/dtypes/config are
unchanged, verify passes and undo restores the source byte for byte. Head edits on a family whose
attention the table does not describe are refused in one line; the exact LoRA refuses routed
experts in one line and equals the twin for the rest (heads, shared and dense neurons).

The default run covers one family of each shape (the slower rest is ``-m slow``, as CI runs it):
"""

from __future__ import annotations

import json

import pytest
import torch

from surgery.bake.bake import bake
from surgery.bake.check import edited_check
from surgery.bake.lora import export_lora
from surgery.bake.undo import undo
from surgery.bake.verify import verify
from surgery.core.architectures import Architecture, architecture
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import SHARED, HeadScale, NeuronScale, Recipe
from surgery.core.errors import RecipeError
from surgery.core.resolve import Resolver
from surgery.core.sites import all_sites
from tests.support.installed import family_param
from tests.support.models import load_fp32, logits, stored_tensors
from tests.support.tiny_moe import FAMILIES

# One of each shape: MLA with first-k dense layers and a shared expert counted by n_shared_experts
# (deepseek_v3), renamed fused tensors on disk and a fused [gate; up] shared input (granitemoeshared),
# transposed fused experts stored as fc1/fc2 (aria_text), Llama 4's dense dispatch under a multimodal
# release (llama4), a shared expert stored under another name (hy_v3), a hybrid (qwen3_next), fused
# dense and shared MLPs (minimax_m3_vl_text), layer kinds from mlp_layer_types (cohere2_moe).
DEFAULT = (
    "deepseek_v3",
    "granitemoeshared",
    "aria_text",
    "llama4",
    "hy_v3",
    "qwen3_next",
    "minimax_m3_vl_text",
    "cohere2_moe",
)
CASES = [family_param(f, *(() if f in DEFAULT else (pytest.mark.slow(minutes=0.3),))) for f in FAMILIES]


def _routed(arch: Architecture) -> tuple[NeuronScale, ...]:
    """Pruned and scaled neurons of several experts, the last expert's last neuron included."""
    g = arch.geometry
    first, last = min(g.sparse_layers), max(g.sparse_layers)
    return (
        NeuronScale(first, 3, 0.0, 1),
        NeuronScale(last, g.expert_size - 1, 0.0, g.num_experts - 1),
        NeuronScale(last, 5, 8.0, 0),
        NeuronScale(first, 7, 8.0, 2),
        NeuronScale(last, 2, 8.0, 3),
    )


def _rest(arch: Architecture) -> tuple:
    """Shared-expert and dense-layer neurons, and heads, where the family has them."""
    g = arch.geometry
    first, last = min(g.sparse_layers), max(g.sparse_layers)
    dense = [layer for layer in range(g.num_layers) if not arch.is_sparse(layer)]
    out: list = []
    if g.shared_size:
        out += [NeuronScale(first, 4, 0.0, SHARED), NeuronScale(last, g.shared_size - 1, 3.0, SHARED)]
    if dense:
        out += [NeuronScale(dense[0], 2, 0.0), NeuronScale(dense[-1], g.intermediate_size - 1, 2.0)]
    if heads := arch.head_layers():  # a hybrid's attention layers only
        out += [HeadScale(heads[0], 1, 2.5), HeadScale(heads[-1], arch.at(heads[-1]).geometry.num_heads - 1, 0.5)]
    return tuple(out)


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("model_type", CASES)
def test_family_bake_equals_twin_verify_undo_lora(tiny, tmp_path, model_type):
    from peft import PeftModel

    src = tiny(model_type)
    ckpt = Checkpoint(src)
    arch = architecture(ckpt.config)
    routed, rest = _routed(arch), _rest(arch)
    recipe = Recipe(routed + rest)
    dst = tmp_path / "baked"
    bake(ckpt, recipe, dst, check=edited_check(ckpt, recipe))  # the bake's own model-free check of every map
    check = json.loads((dst / "surgery.json").read_text())["verification"]
    assert check["kind"] == "edited maps" and check["max_diff_over_bound"] <= 1.0

    model = load_fp32(src)
    base, twin = logits(model), logits(model, recipe.edits)
    assert (logits(model, routed) - base).abs().max().item() > 1e-4  # the routed twin is not vacuous
    assert (logits(load_fp32(dst)) - twin).abs().max().item() <= 1e-5

    before, after = stored_tensors(src), stored_tensors(dst)
    assert before.keys() == after.keys()
    edited = {e["tensor"] for e in json.loads((dst / "surgery.json").read_text())["edited_tensors"]}
    experts = {sl.tensor for sl in Resolver(arch, ckpt.tensors).all(all_sites(arch, routed))}
    assert experts <= edited  # the routed experts' tensors, as the release stores them
    for name in before:
        assert before[name].shape == after[name].shape and before[name].dtype == after[name].dtype
        if name not in edited:
            assert _equal(before[name], after[name]), name
    assert (src / "config.json").read_bytes() == (dst / "config.json").read_bytes()
    report = verify(ckpt, dst)
    assert report.ok, report.problems
    undo(dst, tmp_path / "restored")
    assert all(file_sha256(f) == file_sha256(tmp_path / "restored" / f.name) for f in src.iterdir())

    if arch.layout.limits.head_refusal:
        refused = rf"edits\[0\]: {model_type} has no head edits: .*; edit its (MLP|expert)"
        with pytest.raises(RecipeError, match=refused):
            Recipe((HeadScale(0, 0, 2.0),)).validate(ckpt.config)
    with pytest.raises(RecipeError, match=r"export-lora: neuron .* routed-expert neuron edits have no exact LoRA"):
        export_lora(ckpt, recipe, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    exported = rest
    try:
        export_lora(ckpt, Recipe(rest), tmp_path / "adapter") if rest else None
    except RecipeError as exc:  # PEFT would move down_proj adapters onto the fused experts (see test below)
        assert str(exc).startswith("export-lora: PEFT ") and "onto the fused experts" not in str(exc)
        assert f"onto {model_type}'s fused experts" in str(exc) and any(isinstance(e, NeuronScale) for e in rest)
        exported = tuple(e for e in rest if isinstance(e, HeadScale))
        if exported:
            export_lora(ckpt, Recipe(exported), tmp_path / "adapter")
    if exported:
        expected = logits(model, exported)
        peft_model = PeftModel.from_pretrained(model, tmp_path / "adapter").eval()
        assert (logits(peft_model) - expected).abs().max().item() <= 1e-5


@pytest.mark.parametrize("model_type", ["granitemoe", "aria_text", "hy_v3", "kimi_linear", "llama4"])
def test_fused_in_memory_names_bake_alike(tiny, tmp_path, model_type):
    """The same family re-saved under transformers' in-memory names (fused experts, unrenamed
    modules) bakes to the same twin: the table reads either spelling."""
    src = tiny(model_type, fused=True)
    ckpt = Checkpoint(src)
    arch = architecture(ckpt.config)
    recipe = Recipe(_routed(arch) + _rest(arch))
    bake(ckpt, recipe, tmp_path / "baked")
    model = load_fp32(src)
    assert (logits(load_fp32(tmp_path / "baked")) - logits(model, recipe.edits)).abs().max().item() <= 1e-5
    assert verify(ckpt, tmp_path / "baked").ok


def test_peft_moves_down_proj_adapters_onto_the_experts_so_the_export_refuses(tiny, tmp_path):
    """Why the export refuses neuron adapters on such families: PEFT's conversion of transformers-4
    adapters puts a LoRA aimed at a shared expert's down_proj onto the layer's fused experts."""
    from peft import LoraConfig, get_peft_model

    ckpt = Checkpoint(tiny("glm4_moe"))
    model = load_fp32(ckpt.path)
    target = "model.layers.1.mlp.shared_experts.down_proj"
    peft_model = get_peft_model(model, LoraConfig(r=1, target_modules=[target]))
    adapted = {name for name, _ in peft_model.named_modules() if name.endswith(".lora_A")}
    assert not any(target in name for name in adapted) and any("mlp.experts" in name for name in adapted)
    with pytest.raises(RecipeError, match=rf"PEFT \S+ would load the adapter of '{target}' onto glm4_moe's fused"):
        export_lora(ckpt, Recipe((NeuronScale(1, 4, 0.0, SHARED),)), tmp_path / "adapter")
    assert not (tmp_path / "adapter").exists()


@pytest.mark.parametrize("model_type", ["granitemoeshared", "deepseek_v3"])
def test_twin_under_disk_offload(tiny, tmp_path, model_type):
    """Every layer offloaded to disk by accelerate (a shared MLP beside the experts' block; dense
    layers among expert layers): the twin still equals the bake. (Llama 4 itself does not run under
    disk offload in transformers 5.24: its forward fails with meta tensors, edits or not.)"""
    from transformers import AutoModelForCausalLM

    from surgery.model.hooks import applied

    src = tiny(model_type)
    ckpt = Checkpoint(src)
    arch = architecture(ckpt.config)
    recipe = Recipe(_routed(arch) + _rest(arch))
    bake(ckpt, recipe, tmp_path / "baked")
    model = AutoModelForCausalLM.from_pretrained(
        src, dtype=torch.float32, device_map="auto", max_memory={"cpu": "1KB"}, offload_folder=tmp_path / "off"
    ).eval()
    layer = max(arch.geometry.sparse_layers)
    experts = dict(model.named_modules())[f"model.layers.{layer}.{arch.layout.experts.weights.module}"]
    assert experts.gate_up_proj.device.type == "meta"  # really offloaded
    ids = torch.randint(3, 90, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), applied(model, recipe.edits):
        twin = model(input_ids=ids).logits
    assert (twin - logits(load_fp32(tmp_path / "baked"))).abs().max().item() <= 1e-5
