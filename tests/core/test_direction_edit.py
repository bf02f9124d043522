"""The ``direction`` edit kind: W ← W − w·r(rᵀW) baked exactly, dense and MoE, on every architecture.

Each case bakes direction edits (with head and neuron edits of the same matrices: the scales and
the projection commute) and checks what the kind promises: baked == run-time twin (a forward hook
projecting the module's output) within 1e-5 in float32, only the sites' tensors changed, the
direction left after rounding recorded per matrix, the bake's check and verify pass, undo gives
the source byte for byte, and the same recipe baked twice gives the same bytes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import tracemalloc

import numpy as np
import pytest
import torch

from surgery.bake import bake as bake_module
from surgery.bake import stream as stream_module
from surgery.bake.bake import bake
from surgery.bake.card import card_hook
from surgery.bake.check import edited_check
from surgery.bake.lora import export_lora
from surgery.bake.provenance import load_provenance
from surgery.bake.undo import undo
from surgery.bake.verify import verify
from surgery.core import patches
from surgery.core.architectures import architecture
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import DirectionEdit, HeadScale, NeuronScale, Recipe
from surgery.core.errors import RecipeError
from surgery.core.resolve import Resolver
from surgery.core.sites import all_sites
from surgery.core.vectors import BakedVectors, FolderVectors
from tests.support.directions import direction_recipe, write_vectors
from tests.support.models import load_fp32, logits, stored_tensors
from tests.support.tiny import ARCHS, MOE_ARCHS

MOE_CASES = [(a, f) for a in MOE_ARCHS for f in (False, True) if not (a == "gpt_oss" and not f)]


def _sha256s(folder, skip=()) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name not in skip
    }


def _entries(arch: str) -> list[str]:
    """attention removed in layer 0; the MLP (or every expert, and the shared expert) half-removed in layer 2."""
    if arch not in MOE_ARCHS:
        return [
            "layer: 0, module: attention, weight: 1.0",
            "layer: 2, module: mlp, weight: 0.5, vector: v.safetensors#s",
        ]
    out = [
        "layer: 0, module: attention, weight: 1.0",
        "layer: 2, module: experts, weight: 0.5, vector: v.safetensors#s",
    ]
    return out + (["layer: 1, module: shared_experts, weight: 2.0"] if arch == "qwen2_moe" else [])


def _check_bake(src, tmp_path, recipe: Recipe, tol: float = 1e-5):
    """Bake with the check and the card; the assertions every case shares. Returns the output folder."""
    ckpt = Checkpoint(src)
    dst = tmp_path / "baked"
    result = bake(ckpt, recipe, dst, check=edited_check(ckpt, recipe), card=card_hook())
    base, twin = logits(load_fp32(src)), logits(load_fp32(src), recipe.edits)
    baked = logits(load_fp32(dst))
    assert (twin - base).abs().max().item() > 1e-3  # the edit does something
    assert (twin - baked).abs().max().item() <= tol

    # Only the sites' tensors changed; each projected matrix records the direction it kept.
    arch = architecture(ckpt.config)
    touched = {sl.tensor for sl in Resolver(arch, ckpt.tensors).all(all_sites(arch, recipe.active()))}
    before, after = stored_tensors(src), stored_tensors(dst)
    assert {n for n in before if not torch.equal(before[n].view(torch.uint8), after[n].view(torch.uint8))} == touched
    projected = [e for e in result.provenance.edited_tensors if e.projected]
    assert projected and all(
        abs(e.direction_left - abs(1 - e.direction_weight)) <= 1e-5 for e in projected if e.direction_left is not None
    )
    assert all(e.block_key and not e.rows_key and not e.cols_key for e in projected)  # the whole tensor kept
    assert result.provenance.verification.max_diff_over_bound <= 1.0

    report = verify(ckpt, dst)
    assert report.ok, report.problems
    undo(dst, tmp_path / "restored")
    assert _sha256s(tmp_path / "restored") == _sha256s(src)
    _check_adapter(src, tmp_path, recipe, any(e.tensor.endswith("bias") for e in projected))
    return dst


def _check_adapter(src, tmp_path, recipe: Recipe, projects_a_bias: bool) -> None:
    """The recipe's edits that have an adapter, as a LoRA, equal their run-time twin (== the bake);
    a projected bias is refused in one line (an adapter cannot change a bias)."""
    from peft import PeftModel

    ckpt = Checkpoint(src)
    arch = architecture(ckpt.config)
    adaptable = Recipe(tuple(e for e in recipe.edits if not e.lora_refusal(arch)))
    if not adaptable.edits:
        return
    if projects_a_bias:
        with pytest.raises(RecipeError, match="is projected too, and a LoRA adapter cannot change a bias"):
            export_lora(ckpt, adaptable, tmp_path / "adapter")
        assert not (tmp_path / "adapter").exists()
        return
    summary = export_lora(ckpt, adaptable, tmp_path / "adapter")
    assert summary.extra["directions"] == len(adaptable.directions)
    adapted = logits(PeftModel.from_pretrained(load_fp32(src), tmp_path / "adapter").eval())
    assert (adapted - logits(load_fp32(src), adaptable.edits)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("arch", ARCHS)
def test_dense_direction_bake_equals_twin(tiny, tmp_path, arch):
    src = tiny(arch)
    recipe = Recipe.load(direction_recipe(tmp_path / "r", _entries(arch)))
    recipe = Recipe(recipe.edits + (HeadScale(0, 1, 2.5), NeuronScale(2, 3, 0.0)))  # the same matrices, scaled
    dst = _check_bake(src, tmp_path, recipe)
    card = (dst / "README.md").read_text()
    assert "| direction | 0 | attention | w = 1 |" in card and "direction left" in card


@pytest.mark.parametrize("arch,fused", MOE_CASES, ids=[f"{a}-{'fused' if f else 'per-expert'}" for a, f in MOE_CASES])
def test_moe_direction_bake_equals_twin(tiny, tmp_path, arch, fused):
    src = tiny(arch, fused=fused)
    recipe = Recipe.load(direction_recipe(tmp_path / "r", _entries(arch)))
    recipe = Recipe(recipe.edits + (HeadScale(0, 1, 2.5), NeuronScale(2, 5, 3.0, 1)))
    dst = _check_bake(src, tmp_path, recipe)
    g = architecture(json.loads((src / "config.json").read_text())).geometry
    experts = [
        e
        for e in load_provenance(dst).edited_tensors
        if "experts" in e.tensor and e.projected and "bias" not in e.tensor
    ]
    assert len(experts) == g.num_experts  # every routed expert's down matrix, per-expert or fused
    assert "(4 experts, the largest)" in (dst / "README.md").read_text()


@pytest.mark.parametrize("tied", [False, True])
def test_embeddings_direction(tiny, tmp_path, tied):
    """The [vocab, hidden] table is projected along its columns; a tied table is the output head too."""
    src = tiny("llama", tie_word_embeddings=tied)
    assert ("lm_head.weight" in Checkpoint(src).tensors) != tied
    recipe = Recipe.load(direction_recipe(tmp_path / "r", ["module: embeddings, weight: 1.0"]))
    assert recipe.edits[0].to_dict().get("layer") is None
    _check_bake(src, tmp_path, recipe)
    with pytest.raises(
        RecipeError, match="direction embeddings: a direction edit of the embeddings has no exact adapter here"
    ):
        export_lora(Checkpoint(src), recipe, tmp_path / "adapter2")


def test_vllm_adapters_refuse_the_experts(tiny, tmp_path):
    src = tiny("qwen3_moe")
    recipe = Recipe.load(direction_recipe(tmp_path / "r", ["layer: 1, module: experts, weight: 1.0"]))
    with pytest.raises(RecipeError, match="vLLM serves no adapter on the fused experts parameters"):
        export_lora(Checkpoint(src), recipe, tmp_path / "adapter", vllm=True)
    assert not (tmp_path / "adapter").exists()


def test_bf16_keeps_a_little_of_the_direction_and_says_so(tiny, tmp_path):
    src = tiny("llama", dtype=torch.bfloat16)
    entries = [f"layer: {i}, module: {m}, weight: 1.0" for i in range(3) for m in ("attention", "mlp")]
    recipe = Recipe.load(direction_recipe(tmp_path / "r", entries))
    ckpt = Checkpoint(src)
    result = bake(ckpt, recipe, tmp_path / "baked", check=edited_check(ckpt, recipe), card=card_hook())
    left = [e.direction_left for e in result.provenance.edited_tensors if e.tensor.endswith("proj.weight")]
    assert len(left) == 6 and all(0 < v < 0.02 for v in left)  # rounding to bf16 keeps some, not zero
    card = (tmp_path / "baked" / "README.md").read_text()
    assert "`model.layers.2.mlp.down_proj.weight` |" in card and "not zero in bf16" in card
    assert verify(ckpt, tmp_path / "baked").ok


def test_the_same_recipe_baked_twice_is_byte_identical(tiny, tmp_path):
    src = tiny("qwen3_moe", dtype=torch.bfloat16, fused=True)
    recipe = Recipe.load(direction_recipe(tmp_path / "r", _entries("qwen3_moe")))
    ckpt = Checkpoint(src)
    for out in ("one", "two"):
        bake(ckpt, recipe, tmp_path / out, check=edited_check(ckpt, recipe), card=card_hook())
    assert _sha256s(tmp_path / "one", skip={"surgery.json"}) == _sha256s(tmp_path / "two", skip={"surgery.json"})
    one, two = (json.loads((tmp_path / o / "surgery.json").read_text()) for o in ("one", "two"))
    for record in (one, two):
        record.pop("created"), record.pop("provenance_sha256")
    assert one == two


def test_the_recipe_records_the_vector_and_reads_back(tmp_path):
    path = direction_recipe(tmp_path, ["layer: 1, module: mlp, weight: 0.5"])
    recipe = Recipe.load(path)
    edit = recipe.edits[0]
    digest = hashlib.sha256((tmp_path / "v.safetensors").read_bytes()).hexdigest()
    assert edit.sha256 == digest and edit.to_dict()["sha256"] == digest
    from safetensors.numpy import load_file

    raw = load_file(str(tmp_path / "v.safetensors"))["r"]
    unit = np.frombuffer(edit.unit, dtype=np.float32)
    assert np.array_equal(unit, (raw / np.float32(np.linalg.norm(raw.astype(np.float64)))).astype(np.float32))
    (tmp_path / "again.yaml").write_text(recipe.to_yaml())  # with the sha256: the file is pinned
    assert Recipe.load(tmp_path / "again.yaml") == recipe
    write_vectors(tmp_path, 32, ("r", "s"), seed=9)  # another content under the same name
    with pytest.raises(RecipeError, match=r"edits\[0\]\.sha256: v.safetensors has sha256 .*the recipe pins"):
        Recipe.load(tmp_path / "again.yaml")
    # without a folder the vector is not read: the recipe can be shown, not baked
    shown = Recipe.from_dict(recipe.to_dict())
    assert shown == recipe and not shown.edits[0].unit
    with pytest.raises(RecipeError, match=r"edits\[0\]\.vector: 'v.safetensors#r' was not read"):
        shown.validate(
            {
                "model_type": "llama",
                "num_attention_heads": 4,
                "hidden_size": 32,
                "num_hidden_layers": 3,
                "intermediate_size": 48,
            }
        )


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_vectors_of_other_float_types_are_read(tmp_path, dtype):
    write_vectors(tmp_path, 32, dtype=dtype)
    unit, _ = FolderVectors(tmp_path).unit("v.safetensors#r", None, "edit")
    assert unit.dtype == np.float32 and abs(float(np.linalg.norm(unit.astype(np.float64))) - 1) < 1e-6


def test_a_bake_keeps_its_unit_vectors(tiny, tmp_path):
    """verify, undo and export-lora read a bake's recipe from its folder, without the vector files."""
    src = tiny("llama")
    recipe = Recipe.load(
        direction_recipe(
            tmp_path / "r",
            [
                "layer: 1, module: attention, weight: 1.0",
                "layer: 2, module: attention, weight: 0.0, vector: v.safetensors#s",
            ],
        )
    )  # a no-op, still recorded
    bake(Checkpoint(src), recipe, tmp_path / "baked")
    record = load_provenance(tmp_path / "baked")
    again = Recipe.from_dict(record.recipe.to_dict(), vectors=BakedVectors(tmp_path / "baked"))
    assert [e.unit for e in again.edits] == [e.unit for e in recipe.edits]
    assert [e.unit for e in record.replayable_recipe(tmp_path / "baked").edits] == [e.unit for e in recipe.edits]
    assert "surgery.vectors" in record.files
    shutil.rmtree(tmp_path / "r")  # the vector files are not needed any more
    assert verify(Checkpoint(src), tmp_path / "baked").ok


def test_the_bake_streams_a_projected_tensor(tmp_path, monkeypatch):
    """Memory stays a few blocks, not the edited tensors: the originals undo needs are spooled to disk."""
    from tests.support.tiny import build_tiny

    src = build_tiny(
        "llama", tmp_path / "src", hidden_size=256, intermediate_size=1024, head_dim=64, num_hidden_layers=4
    )
    entries = [f"layer: {i}, module: {m}, weight: 1.0" for i in range(4) for m in ("attention", "mlp")]
    recipe = Recipe.load(direction_recipe(tmp_path / "r", entries, hidden=256))
    ckpt = Checkpoint(src)
    edited = sum(
        ckpt.tensor(p.info.name).nbytes for p in patches.patch_plan(ckpt, recipe.validate(ckpt.config), recipe.active())
    )
    # Every buffer smaller than one tensor (hashing reads 8 MB at a time: a constant, not the model)
    monkeypatch.setattr(patches, "CHUNK_BYTES", 16 << 10)
    monkeypatch.setattr(stream_module, "STREAM_BLOCK", 64 << 10)
    monkeypatch.setattr(bake_module, "COPY_BLOCK", 64 << 10)
    monkeypatch.setattr(bake_module, "file_sha256", functools.partial(file_sha256, chunk=64 << 10))
    tracemalloc.start()
    try:
        bake(ckpt, recipe, tmp_path / "baked")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert edited > 5 << 20 and peak < edited / 5, (peak, edited)
    undo(tmp_path / "baked", tmp_path / "restored")
    assert _sha256s(tmp_path / "restored") == _sha256s(src)


def test_conflicting_directions_on_one_module_are_refused(tmp_path):
    path = direction_recipe(
        tmp_path, ["layer: 1, module: mlp, weight: 1.0", "layer: 1, module: mlp, weight: 1.0, vector: v.safetensors#s"]
    )
    with pytest.raises(
        RecipeError,
        match="conflicting edits for direction 1:mlp: v.safetensors#r × 1.0 and v.safetensors#s × 1.0; keep one",
    ):
        Recipe.load(path)
    assert DirectionEdit.kind == "direction"
