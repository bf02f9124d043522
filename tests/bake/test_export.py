"""Exact LoRA export: PeftModel(source, adapter) == baked checkpoint, every architecture, ± --vllm."""

from __future__ import annotations

import json

import pytest
import torch

from surgery.bake.bake import bake
from surgery.bake.lora import VLLM_RANKS, export_lora
from surgery.core.architectures import architecture
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import CheckpointError, RecipeError
from tests.support.models import load_fp32
from tests.support.tiny import ARCHS


def _recipe(config: dict) -> Recipe:
    g = architecture(config).geometry
    last = g.num_layers - 1
    return Recipe(
        (
            HeadScale(0, 1, 2.5),
            HeadScale(0, 3, 0.0),
            HeadScale(last, g.num_heads - 1, 0.5),
            NeuronScale(1, 3, 0.0),
            NeuronScale(last, 5, 1.5),
        )
    )


def _logits(model) -> torch.Tensor:
    ids = torch.randint(3, 90, (2, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        return model(input_ids=ids).logits


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
        assert set(summary.modules.values()) == {cfg["r"]}
    else:
        ranks = summary.modules
        assert sorted(ranks.values()) == sorted([2 * d, d, 1, 1])  # two heads in layer 0, one elsewhere
        for name, r in ranks.items():
            assert cfg["rank_pattern"].get(name, cfg["r"]) == r == cfg["alpha_pattern"].get(name, cfg["lora_alpha"])

    baked = _logits(load_fp32(tmp_path / "baked"))
    peft_model = PeftModel.from_pretrained(load_fp32(src), tmp_path / "adapter").eval()
    assert (_logits(peft_model) - baked).abs().max().item() <= 1e-5
    merged = peft_model.merge_and_unload()
    assert (_logits(merged) - baked).abs().max().item() <= 1e-5
    assert (_logits(load_fp32(src)) - baked).abs().max().item() > 1e-3  # the edit does something


def test_bf16_source_adapter_matches_baked(tiny, tmp_path):
    from peft import PeftModel

    src = tiny("llama", dtype=torch.bfloat16, shard="20KB")
    ckpt = Checkpoint(src)
    recipe = Recipe((NeuronScale(1, 3, 0.0), HeadScale(2, 0, 2.0)))
    bake(ckpt, recipe, tmp_path / "baked")
    export_lora(ckpt, recipe, tmp_path / "adapter")
    merged = PeftModel.from_pretrained(load_fp32(src), tmp_path / "adapter").merge_and_unload()
    # the baked bf16 weights round α·W once; the adapter holds fp32 factors of the bf16 source
    assert (_logits(merged) - _logits(load_fp32(tmp_path / "baked"))).abs().max().item() <= 0.05


def test_vllm_rank_over_512_is_an_error(tiny, tmp_path):
    src = tiny("llama", intermediate_size=600)
    recipe = Recipe(tuple(NeuronScale(0, i, 0.0) for i in range(513)))
    with pytest.raises(RecipeError, match="512"):
        export_lora(Checkpoint(src), recipe, tmp_path / "adapter", vllm=True)
    assert not (tmp_path / "adapter").exists()


def test_identity_recipe_is_an_error(tiny, tmp_path):
    with pytest.raises(RecipeError, match="changes nothing"):
        export_lora(Checkpoint(tiny("llama")), Recipe((HeadScale(0, 0, 1.0),)), tmp_path / "adapter")


# --- export-lora --recipe BAKED: the recipe recorded by a bake, only over its own source ---------


def _adapter_tensors(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


@pytest.fixture
def baked_by_cli(tiny, tmp_path, capsys):
    """A tiny llama baked by the CLI (amplify-heads), and the same edit as a recipe YAML."""
    from tests.support.cli import run_main

    src = tiny("llama")
    result = run_main(
        ["amplify-heads", src, "--heads", "0.1,2.3", "--alpha", "2.5", "--out", tmp_path / "baked", "--no-verify"],
        capsys,
    )
    assert result.returncode == 0, result.stderr
    (tmp_path / "recipe.yaml").write_text(Recipe((HeadScale(0, 1, 2.5), HeadScale(2, 3, 2.5))).to_yaml())
    return src, tmp_path / "baked"


@pytest.mark.parametrize("given", ["folder", "surgery.json"])
def test_export_lora_from_a_baked_folder(baked_by_cli, tmp_path, capsys, given):
    from tests.support.cli import run_main

    src, baked = baked_by_cli
    recipe = baked if given == "folder" else baked / "surgery.json"
    for out, source in (("from-bake", recipe), ("from-yaml", tmp_path / "recipe.yaml")):
        result = run_main(["export-lora", src, "--recipe", source, "--out", tmp_path / out], capsys)
        assert result.returncode == 0, result.stderr
    a, b = _adapter_tensors(tmp_path / "from-bake"), _adapter_tensors(tmp_path / "from-yaml")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_export_lora_refuses_a_bake_of_another_model(baked_by_cli, tiny, tmp_path, capsys):
    from tests.support.cli import error_line, run_main

    _, baked = baked_by_cli
    other = tiny("llama", seed=1)  # same architecture, other weights
    line = error_line(run_main(["export-lora", other, "--recipe", baked, "--out", tmp_path / "adapter"], capsys))
    assert f"{baked} was baked from " in line and f"not from {other}" in line
    assert "give the source it was baked from as MODEL" in line
    assert not (tmp_path / "adapter").exists()


@pytest.mark.parametrize("fingerprint", [True, False], ids=["fingerprint", "sha256"])
def test_export_lora_names_what_changed_in_the_same_source(baked_by_cli, tmp_path, capsys, fingerprint):
    """The source folder changed after the bake: the error names the content that differs, not the
    same path twice (before: "was baked from models/x, not from models/x")."""
    from safetensors.torch import load_file, save_file

    from surgery.bake.provenance import provenance_text
    from tests.support.cli import error_line, run_main

    src, baked = baked_by_cli
    if not fingerprint:  # older bakes: the sha256 of every weight file decides
        prov = json.loads((baked / "surgery.json").read_text())
        del prov["source"]["fingerprint"]
        (baked / "surgery.json").write_text(provenance_text(prov))
    recorded = json.loads((baked / "surgery.json").read_text())
    tensors = load_file(str(src / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] + 1  # retrained since
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    line = error_line(run_main(["export-lora", src, "--recipe", baked, "--out", tmp_path / "adapter"], capsys))
    assert f"{src} changed since {baked} was baked from it" in line and "not from" not in line
    if fingerprint:
        now = Checkpoint(src).fingerprint()
        assert f"fingerprint is {now[:12]}…, the bake recorded {recorded['source']['fingerprint'][:12]}…" in line
    else:
        assert (
            f"model.safetensors has sha256 {file_sha256(src / 'model.safetensors')[:12]}…, the bake recorded "
            f"{recorded['source_files']['model.safetensors'][:12]}…"
        ) in line
    assert f"surgery undo {baked} restores it" in line and not (tmp_path / "adapter").exists()


def test_export_lora_from_a_bake_without_a_recorded_fingerprint(baked_by_cli, tiny, tmp_path, capsys):
    """Older bakes recorded no fingerprint: the sha256 of the weight files decides."""
    from surgery.bake.provenance import provenance_text
    from tests.support.cli import error_line, run_main

    src, baked = baked_by_cli
    prov = json.loads((baked / "surgery.json").read_text())
    del prov["source"]["fingerprint"]
    (baked / "surgery.json").write_text(provenance_text(prov))
    assert run_main(["export-lora", src, "--recipe", baked, "--out", tmp_path / "ok"], capsys).returncode == 0
    line = error_line(
        run_main(["export-lora", tiny("llama", seed=1), "--recipe", baked, "--out", tmp_path / "no"], capsys)
    )
    assert "was baked from" in line


def test_export_lora_refuses_a_tampered_surgery_json(baked_by_cli, tmp_path, capsys):
    from tests.support.cli import error_line, run_main

    src, baked = baked_by_cli
    text = (baked / "surgery.json").read_text()
    (baked / "surgery.json").write_text(text.replace('"alpha": 2.5', '"alpha": 25.0'))
    line = error_line(run_main(["export-lora", src, "--recipe", baked, "--out", tmp_path / "adapter"], capsys))
    assert "changed after the bake" in line and "give the recipe YAML" in line


def test_routed_expert_edits_are_refused_in_one_line(tiny, tmp_path):
    """Routed experts are fused 3-D parameters in memory: no exact adapter, so a clear refusal."""
    ckpt = Checkpoint(tiny("qwen2_moe"))
    recipe = Recipe((HeadScale(0, 1, 2.0), NeuronScale(1, 3, 0.0, 2), NeuronScale(2, 4, 0.0, 1)))
    with pytest.raises(
        RecipeError, match=r"neuron 1:e2:3 and 1 more: routed-expert neuron edits have no exact LoRA.*baked checkpoint"
    ):
        export_lora(ckpt, recipe, tmp_path / "adapter")
    assert not (tmp_path / "adapter").exists()


def test_shared_expert_and_heads_of_a_moe_export_exactly(tiny, tmp_path):
    from peft import PeftModel

    src = tiny("qwen2_moe")
    ckpt = Checkpoint(src)
    recipe = Recipe((HeadScale(0, 1, 2.5), NeuronScale(1, 3, 0.0, "shared"), NeuronScale(2, 5, 1.5, "shared")))
    bake(ckpt, recipe, tmp_path / "baked")
    export_lora(ckpt, recipe, tmp_path / "adapter")
    baked = _logits(load_fp32(tmp_path / "baked"))
    peft_model = PeftModel.from_pretrained(load_fp32(src), tmp_path / "adapter").eval()
    assert (_logits(peft_model) - baked).abs().max().item() <= 1e-5
    assert (_logits(load_fp32(src)) - baked).abs().max().item() > 1e-3


def test_the_same_export_writes_the_same_bytes_in_any_process(tiny, tmp_path):
    """PEFT writes target_modules from a set, in the hash order each process seeds anew (two exports of
    one recipe differed): written sorted, the one order every process agrees on."""
    src = tiny("llama")
    export_lora(Checkpoint(src), _recipe(Checkpoint(src).config), tmp_path / "adapter")
    targets = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["target_modules"]
    assert targets == sorted(targets) and len(targets) > 1


@pytest.mark.parametrize("stored", ["fp8-block", "int4-group", "awq"])
def test_a_quantized_checkpoint_is_refused_in_one_line(stored, tmp_path, capsys):
    """The factors are read from the stored weights: codes without their scales would make a wrong
    adapter, so a quantized checkpoint is refused, saying what to do, and nothing is written."""
    from tests.support.awq import build_awq
    from tests.support.cli import error_line, run_main
    from tests.support.fp8 import build_fp8
    from tests.support.int_packed import build_int

    builds = {
        "fp8-block": lambda p: build_fp8(p, "block"),
        "int4-group": lambda p: build_int(p, "w4a16-g8"),
        "awq": build_awq,
    }
    src, out = builds[stored](tmp_path / "src"), tmp_path / "adapter"
    with pytest.raises(CheckpointError, match=r"writes an adapter from float weights, and .* stores .* weights: bake"):
        export_lora(Checkpoint(src), Recipe((NeuronScale(1, 3, 0.0),)), out)
    (tmp_path / "recipe.yaml").write_text(Recipe((HeadScale(0, 1, 2.0),)).to_yaml())
    line = error_line(run_main(["export-lora", src, "--recipe", tmp_path / "recipe.yaml", "--out", out], capsys))
    assert line.startswith("Error: export-lora writes an adapter from float weights"), line
    assert not out.exists()
