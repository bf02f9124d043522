"""The ``steer`` edit kind (ablate-direction --add): b ← b + c·r on a residual writer's output bias.

On families whose residual writers have output biases (GPT-2's Conv1D c_proj, GPT-NeoX's dense
layers, GPT-OSS's attention output and every routed expert's down bias): baked == run-time twin
(fp32, ≤ 1e-5), only bias tensors change, the bake's check and verify pass, undo gives the source
byte for byte. Where a module has no bias (Llama) the bake is refused in one line, nothing written;
LoRA and GGUF refuse it in one line.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

import surgery
from surgery.core.architectures import architecture
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import Recipe
from surgery.core.errors import RecipeError
from surgery.core.resolve import Resolver
from surgery.core.sites import all_sites
from tests.support.cli import error_line, run_main
from tests.support.coverage import build_family, save_family
from tests.support.directions import direction_recipe
from tests.support.models import load_fp32, logits, stored_tensors


def _sha256s(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _entries(arch) -> list[str]:
    """The first attention layer's output and the last layer's MLP (every routed expert on a MoE layer)."""
    last = arch.geometry.num_layers - 1
    mlp = "experts" if arch.is_sparse(last) else "mlp"
    return [
        f"layer: {arch.head_layers()[0]}, module: attention, weight: 2.0",
        f"layer: {last}, module: {mlp}, weight: -1.5, vector: v.safetensors#s",
    ]


def _changed(a, b) -> set[str]:
    return {n for n in a if not torch.equal(a[n].reshape(-1).view(torch.uint8), b[n].reshape(-1).view(torch.uint8))}


@pytest.mark.parametrize("model_type", ["gpt2", "gpt_neox", "gpt_oss"])
def test_steer_bake_equals_twin_and_changes_only_biases(tmp_path, model_type):
    model = build_family(model_type)
    src = save_family(model, tmp_path / "src")
    ckpt = Checkpoint(src)
    arch = architecture(ckpt.config)
    recipe = Recipe.load(
        direction_recipe(tmp_path / "r", _entries(arch), hidden=arch.geometry.hidden_size, kind="steer")
    )
    base, twin = logits(model), logits(model, recipe.edits)
    assert (twin - base).abs().max().item() > 1e-3  # the control vector does something

    baked = tmp_path / "baked"
    result = surgery.apply(recipe, src, baked)
    assert (logits(load_fp32(baked)) - twin).abs().max().item() <= 1e-5
    assert result.provenance.verification.max_diff_over_bound <= 1.0

    resolved = {sl.tensor for sl in Resolver(arch, ckpt.tensors).all(all_sites(arch, recipe.active()))}
    changed = _changed(stored_tensors(src), stored_tensors(baked))
    assert changed == resolved and all(n.endswith("bias") for n in changed)
    if model_type == "gpt_oss":  # every routed expert's row of the fused down bias
        assert any(n.endswith("experts.down_proj_bias") for n in changed)
    records = json.loads((baked / "surgery.json").read_text())["edited_tensors"]
    assert {e["tensor"] for e in records} == resolved
    assert all(e["direction_op"] == "add" and "direction_left" not in e for e in records)
    card = (baked / "README.md").read_text()
    assert "| steer |" in card and "c = 2" in card and "` bias" in card

    report = surgery.verify(src, baked)
    assert report.ok, report.problems
    surgery.undo(baked, tmp_path / "restored")
    assert _sha256s(tmp_path / "restored") == _sha256s(src)

    with pytest.raises(RecipeError, match="a LoRA adapter cannot change a bias") as refused:
        surgery.export_lora(src, recipe, tmp_path / "adapter")
    assert "\n" not in str(refused.value) and not (tmp_path / "adapter").exists()


def test_a_module_without_a_bias_is_refused_in_one_line(tmp_path):
    """Llama's o_proj has no bias: adding one would change the checkpoint's names; nothing is written."""
    model = build_family("llama")
    src = save_family(model, tmp_path / "src")
    entry = ["layer: 0, module: attention, weight: 1.0"]
    recipe = Recipe.load(direction_recipe(tmp_path / "r", entry, hidden=model.config.hidden_size, kind="steer"))
    with pytest.raises(RecipeError) as refused:
        surgery.apply(recipe, src, tmp_path / "out")
    line = str(refused.value)
    assert "\n" not in line and "self_attn.o_proj" in line and "has no bias" in line and "direction edit" in line
    assert not (tmp_path / "out").exists()


def test_the_embeddings_and_a_direction_of_the_same_module_are_refused(tmp_path):
    with pytest.raises(RecipeError, match="steer a layer's attention or mlp"):
        Recipe.load(direction_recipe(tmp_path / "a", ["module: embeddings, weight: 1.0"], kind="steer")).validate(
            build_family("gpt2").config.to_dict()
        )
    extra = "  - {type: direction, layer: 0, module: attention, weight: 1.0, vector: v.safetensors#r}\n"
    with pytest.raises(RecipeError, match=r"conflicting edits for direction 0:attention: \+ 1.0 × v.safetensors#r and"):
        Recipe.load(
            direction_recipe(tmp_path / "b", ["layer: 0, module: attention, weight: 1.0"], extra=extra, kind="steer")
        )


def test_ablate_direction_add_end_to_end(tmp_path, capsys, monkeypatch):
    """find-direction, then `surgery ablate-direction --add` (CLI) on GPT-2: steer edits on every layer's
    attention and MLP biases, verified; on Llama the same command is one Error line, nothing written."""
    from tests.support.tokenizer import save_char_tokenizer

    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache"))
    (tmp_path / "a.txt").write_text("the sky is green\nno red is blue\nwhat is this\n")
    (tmp_path / "b.txt").write_text("a quiet day\nmost cats sleep\nrain again\n")
    found = {}
    for model_type in ("gpt2", "llama"):
        src = save_family(build_family(model_type, vocab_size=128), tmp_path / model_type)
        save_char_tokenizer(src)
        found[model_type] = surgery.find_direction(src, a=tmp_path / "a.txt", b=tmp_path / "b.txt", device="cpu").path

    out = tmp_path / "steered"
    result = run_main(
        ["ablate-direction", tmp_path / "gpt2", "--direction", found["gpt2"], "--add", "--weight", "2", "--out", out],
        capsys,
    )
    assert result.returncode == 0, result.stderr
    record = json.loads((out / "surgery.json").read_text())
    edits = record["recipe"]["edits"]
    assert edits and all(e["type"] == "steer" and e["weight"] == 2 for e in edits)
    assert record["direction_kernel"]["add"] is True
    assert all(e["tensor"].endswith("bias") for e in record["edited_tensors"])
    assert surgery.verify(tmp_path / "gpt2", out).ok

    refused = tmp_path / "refused"
    line = error_line(
        run_main(
            ["ablate-direction", tmp_path / "llama", "--direction", found["llama"], "--add", "--out", refused], capsys
        )
    )
    assert "has no bias" in line and not refused.exists()
