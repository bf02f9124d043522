"""MLA, DeepSeek-V4's grouped output and hybrid layers: every family of the table's issue-24 MLA section
proven on a tiny random model built from its own config class.

Per family: head α in the first and the last attention layer (MLA: v_head_dim columns; DeepSeek-V4: a
block of o_a_proj within its group's rows; hybrid: full-attention layers only), a scaled and a pruned
dense neuron where the family has a dense MLP, routed and shared expert neurons where its row has
experts. The bake equals the run-time twin (fp32 logits within 1e-5, and the recipe does change them),
every tensor outside the edited ones is byte-identical, verify passes, undo restores every file byte
for byte, and the LoRA export equals the bake or is refused in one line.
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
from surgery.core.architectures import architecture
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import SHARED, HeadScale, NeuronScale, Recipe
from surgery.core.errors import RecipeError
from tests.support.families import FAMILIES, WRAPPERS, build_family
from tests.support.models import load_fp32, logits, stored_tensors

TYPES = sorted([*FAMILIES, *WRAPPERS])
# A third of the families, one of each shape, run by default; the rest under -m slow (CI).
DEFAULT = {
    "minicpm3",
    "deepseek_v3",
    "deepseek_v4",
    "hy_v4",
    "qwen3_5",
    "qwen3_next",
    "nemotron_h",
    "recurrent_gemma",
    "kimi_linear",
    "bailing_hybrid",
    "lfm2",
}


def _recipe(config: dict) -> Recipe:
    """Heads in the first and last attention layer, a pruned and a scaled dense neuron, expert neurons."""
    arch = architecture(config)
    heads, dense, g = arch.head_layers(), arch.dense_mlp_layers(), arch.geometry
    edits = [HeadScale(heads[0], 1, 2.5), HeadScale(heads[-1], g.num_heads - 1, 0.0)]
    if dense:
        edits += [NeuronScale(dense[0], 3, 0.0), NeuronScale(dense[-1], g.intermediate_size - 1, 1.7)]
    if g.sparse_layers:
        sparse = sorted(g.sparse_layers)
        edits += [NeuronScale(sparse[0], 2, 0.0, 1), NeuronScale(sparse[-1], g.expert_size - 1, 2.0, 0)]
        edits += [NeuronScale(sparse[0], 4, 0.0, SHARED)] if arch.layout.experts.shared else []
    return Recipe(tuple(edits))


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))  # bytes: -0.0 ≠ +0.0


@pytest.mark.parametrize(
    "model_type", [t if t in DEFAULT else pytest.param(t, marks=pytest.mark.slow(minutes=0.2)) for t in TYPES]
)
def test_family_bake_equals_twin_verify_undo_lora(tmp_path, model_type):
    src = build_family(model_type, tmp_path / "src")
    ckpt = Checkpoint(src)
    recipe = _recipe(ckpt.config)
    dst = tmp_path / "baked"
    bake(ckpt, recipe, dst, check=edited_check(ckpt, recipe))

    model = load_fp32(src)
    base, twin = logits(model), logits(model, recipe.edits)
    baked = logits(load_fp32(dst))
    assert (base - twin).abs().max().item() > 1e-3  # the recipe does something
    assert (twin - baked).abs().max().item() <= 1e-5

    before, after = stored_tensors(src), stored_tensors(dst)
    edited = {e["tensor"] for e in json.loads((dst / "surgery.json").read_text())["edited_tensors"]}
    assert before.keys() == after.keys() and edited < before.keys()
    assert {n for n in before if not _equal(before[n], after[n])} <= edited
    report = verify(ckpt, dst)
    assert report.ok, report.problems
    undo(dst, tmp_path / "restored")
    assert all(file_sha256(f) == file_sha256(tmp_path / "restored" / f.name) for f in src.iterdir())

    # LoRA: the same edit as an adapter on the loaded source (its twin hooks are gone), or one line
    lora_recipe = Recipe(tuple(e for e in recipe.edits if not (isinstance(e, NeuronScale) and e.routed)))
    try:
        export_lora(ckpt, lora_recipe, tmp_path / "adapter")
    except RecipeError as exc:
        assert "\n" not in str(exc) and not (tmp_path / "adapter").exists()
        if architecture(ckpt.config).layout.attention.grouped_output:  # DeepSeek-V4: PEFT cannot adapt o_a_proj
            assert "grouped o_a_proj" in str(exc)
            return
        # a mixture-of-experts type whose MLP targets PEFT moves onto the experts: heads alone export
        assert "fused experts" in str(exc)
        lora_recipe = Recipe(tuple(e for e in recipe.edits if isinstance(e, HeadScale)))
        export_lora(ckpt, lora_recipe, tmp_path / "adapter")
    from peft import PeftModel

    bake(ckpt, lora_recipe, tmp_path / "baked-lora")
    adapted = logits(PeftModel.from_pretrained(model, tmp_path / "adapter").eval())
    assert (adapted - logits(load_fp32(tmp_path / "baked-lora"))).abs().max().item() <= 1e-5


def test_a_config_contradicting_the_attention_names_its_fields_before_any_read(tiny, tmp_path):
    """The scale guards read the edited slices first: a config whose head_dim contradicts o_proj is
    the attention check's line (naming the fields), not a bare shape mismatch."""
    import surgery
    from surgery.core.errors import CheckpointError

    src = tiny("llama")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "head_dim": 4}))
    with pytest.raises(CheckpointError, match=r"\(num_attention_heads × head_dim = 4 × 4 columns\)"):
        surgery.apply(Recipe((HeadScale(0, 1, 2.0),)), src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _direction_entries(arch) -> list[str]:
    """A direction out of every residual writer the family has: each attention layer's output, each
    hybrid layer's other mixer (Mamba, linear attention, convolution), each dense MLP, the first sparse
    layer's routed experts (and its shared expert)."""
    entries = [f"layer: {i}, module: attention, weight: 1.0" for i in arch.head_layers()]
    entries += [f"layer: {i}, module: mixer, weight: 0.75" for i in arch.mixer_layers()]
    entries += [f"layer: {i}, module: mlp, weight: 0.5, vector: v.safetensors#s" for i in arch.dense_mlp_layers()]
    if arch.geometry.sparse_layers:
        first = min(arch.geometry.sparse_layers)
        entries += [f"layer: {first}, module: experts, weight: 1.0"]
        entries += [f"layer: {first}, module: shared_experts, weight: 2.0"] if arch.layout.experts.shared else []
    return entries


@pytest.mark.parametrize("model_type", ["minicpm3", "deepseek_v4", "qwen3_next", "nemotron_h", "lfm2"])
def test_direction_edits_on_mla_grouped_output_and_hybrid_layers(tmp_path, model_type):
    """A direction edit projects each family's own residual writers (MLA's o_proj, DeepSeek-V4's o_b_proj
    after its grouped o_a_proj, a hybrid's attention, mixer and dense-MLP outputs): bake == twin, verify,
    undo byte for byte; a module a layer does not have is refused in one line (attention on a mixer
    layer: use mixer), nothing written."""
    from tests.support.directions import direction_recipe

    src = build_family(model_type, tmp_path / "src")
    ckpt = Checkpoint(src)
    arch = architecture(ckpt.config)
    recipe = Recipe.load(direction_recipe(tmp_path / "r", _direction_entries(arch)))
    dst = tmp_path / "baked"
    bake(ckpt, recipe, dst, check=edited_check(ckpt, recipe))
    model = load_fp32(src)
    base, twin = logits(model), logits(model, recipe.edits)
    assert (base - twin).abs().max().item() > 1e-3  # the recipe does something
    assert (twin - logits(load_fp32(dst))).abs().max().item() <= 1e-5
    projected = {e["tensor"] for e in json.loads((dst / "surgery.json").read_text())["edited_tensors"]}
    assert any(f".{arch.stored_module(arch.attention_output()[0])}." in name for name in projected)  # stored names
    report = verify(ckpt, dst)
    assert report.ok, report.problems
    undo(dst, tmp_path / "restored")
    assert all(file_sha256(f) == file_sha256(tmp_path / "restored" / f.name) for f in src.iterdir())

    other = [i for i in range(arch.geometry.num_layers) if i not in arch.head_layers()]
    no_mlp = [
        i
        for i in range(arch.geometry.num_layers)
        if i not in arch.dense_mlp_layers() and i not in arch.geometry.sparse_layers
    ]
    refused = ([f"layer: {other[0]}, module: attention, weight: 1.0"] if other else []) + (
        [f"layer: {no_mlp[0]}, module: mlp, weight: 1.0"] if no_mlp else []
    )
    for i, entry in enumerate(refused):
        bad = Recipe.load(direction_recipe(tmp_path / f"bad{i}", [entry]))
        with pytest.raises(
            RecipeError, match=r"layer of this .* model: it has no|layer: it writes through .*; use mixer"
        ) as exc:
            bake(ckpt, bad, tmp_path / f"out{i}")
        assert "\n" not in str(exc.value) and not (tmp_path / f"out{i}").exists()
