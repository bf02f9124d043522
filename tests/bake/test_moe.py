"""Mixtures of experts: baked checkpoint == run-time twin per architecture and per on-disk layout.

The same standard as the dense matrix in test_bake.py: fp32 logits within 1e-5 of the twin (a
forward hook on the fused in-memory experts module), untouched tensors byte-identical, names,
shapes, dtypes and config unchanged, stock loading without missing keys, verify and undo.
"""

from __future__ import annotations

import json

import pytest
import torch

from surgery.bake.bake import bake
from surgery.bake.undo import undo
from surgery.bake.verify import verify
from surgery.core.architectures import architecture
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import SHARED, HeadScale, NeuronScale, Recipe
from surgery.core.errors import RecipeError
from tests.bake.test_bake import _logits, _tensors
from tests.conftest import MOE_ARCHS

# save_pretrained writes GPT-OSS fused already: its "per-expert" case would repeat the fused one.
CASES = [(a, f) for a in MOE_ARCHS for f in (False, True) if not (a == "gpt_oss" and not f)]


def _expert_edits(config: dict) -> tuple[NeuronScale, ...]:
    """Pruned and scaled neurons of several experts, the last expert's last neuron included."""
    g = architecture(config).geometry
    last = g.num_layers - 1
    return (NeuronScale(0, 3, 0.0, 1), NeuronScale(1, g.expert_size - 1, 0.0, g.num_experts - 1),
            NeuronScale(1, 5, 2.5, 2), NeuronScale(last, 7, 0.0, 0), NeuronScale(last, 8, 0.5, 0))


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))  # bytes: -0.0 ≠ +0.0, NaN == NaN


@pytest.mark.parametrize("arch,fused", CASES, ids=[f"{a}-{'fused' if f else 'per-expert'}" for a, f in CASES])
def test_moe_baked_equals_runtime_twin(tiny, tmp_path, arch, fused):
    src = tiny(arch, fused=fused)
    ckpt = Checkpoint(src)
    arch_ = architecture(ckpt.config)
    assert arch_.fused_experts(ckpt.tensors) == (fused or arch == "gpt_oss")
    experts = _expert_edits(ckpt.config)
    extra = (NeuronScale(1, 4, 0.0, SHARED), NeuronScale(2, 5, 3.0, SHARED)) if arch == "qwen2_moe" else ()
    recipe = Recipe(experts + extra + (HeadScale(0, 1, 2.5), HeadScale(2, 3, 0.5)))
    dst = tmp_path / "baked"
    bake(ckpt, recipe, dst)

    base = _logits(src)
    # the expert edits alone change the output (the twin is not vacuous), and so does the rest
    assert (base - _logits(src, experts)).abs().max().item() > 1e-3
    assert (_logits(dst) - _logits(src, recipe.edits)).abs().max().item() <= 1e-5

    before, after = _tensors(src), _tensors(dst)
    assert before.keys() == after.keys()
    edited = {e["tensor"] for e in json.loads((dst / "surgery.json").read_text())["edited_tensors"]}
    assert any("experts" in name for name in edited)
    for name in before:
        assert before[name].shape == after[name].shape and before[name].dtype == after[name].dtype
        if name not in edited:
            assert _equal(before[name], after[name]), name
    assert (src / "config.json").read_bytes() == (dst / "config.json").read_bytes()

    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(dst, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]

    report = verify(Checkpoint(src), dst)  # also: every byte outside the edited slices unchanged
    assert report.ok, report.problems
    restored = tmp_path / "restored"
    undo(dst, restored)
    for f in src.iterdir():
        assert file_sha256(f) == file_sha256(restored / f.name), f.name


def test_fused_expert_slices_are_exactly_the_neuron(tiny, tmp_path):
    """Pruning 0:e2:5 on fused Mixtral changes gate_up rows 5 and I+5 and down column 5 of expert 2 only."""
    src = tiny("mixtral", fused=True)
    ckpt = Checkpoint(src)
    I = architecture(ckpt.config).geometry.expert_size
    bake(ckpt, Recipe((NeuronScale(0, 5, 0.0, 2),)), tmp_path / "baked")
    before, after = _tensors(src), _tensors(tmp_path / "baked")
    name = "model.layers.0.mlp.experts."
    gu, down = after[name + "gate_up_proj"], after[name + "down_proj"]
    assert not gu[2, [5, I + 5]].any() and not down[2, :, 5].any()
    keep_gu = torch.ones_like(gu, dtype=torch.bool)
    keep_gu[2, [5, I + 5]] = False
    keep_down = torch.ones_like(down, dtype=torch.bool)
    keep_down[2, :, 5] = False
    assert torch.equal(gu[keep_gu], before[name + "gate_up_proj"][keep_gu])
    assert torch.equal(down[keep_down], before[name + "down_proj"][keep_down])


def test_gpt_oss_interleaved_neuron_and_bias(tiny, tmp_path):
    """GPT-OSS [E, H, 2I] interleaved: neuron j is columns 2j, 2j+1 of gate_up (and its bias), row j of down."""
    src = tiny("gpt_oss", dtype=torch.bfloat16)
    ckpt = Checkpoint(src)
    bake(ckpt, Recipe((NeuronScale(1, 6, 0.0, 3),)), tmp_path / "baked")
    before, after = _tensors(src), _tensors(tmp_path / "baked")
    name = "model.layers.1.mlp.experts."
    assert not after[name + "gate_up_proj"][3, :, [12, 13]].float().any()
    assert not after[name + "gate_up_proj_bias"][3, [12, 13]].float().any()
    assert not after[name + "down_proj"][3, 6].float().any()
    assert _equal(after[name + "down_proj_bias"], before[name + "down_proj_bias"])
    report = verify(ckpt, tmp_path / "baked")
    assert report.ok and report.max_abs_logit_diff <= report.tolerance, report.problems


def test_per_expert_sharded_bf16(tiny, tmp_path):
    src = tiny("qwen3_moe", dtype=torch.bfloat16, shard="20KB")
    ckpt = Checkpoint(src)
    assert len(ckpt.weight_files) > 1
    bake(ckpt, Recipe(_expert_edits(ckpt.config)), tmp_path / "baked")
    report = verify(ckpt, tmp_path / "baked")
    assert report.ok and report.max_abs_logit_diff <= report.tolerance, report.problems
    undo(tmp_path / "baked", tmp_path / "restored")


def test_cli_prunes_named_expert_neurons_and_says_so(tiny, tmp_path, capsys):
    """prune-neurons --neurons L:eE:N,L:s:N bakes, checks logits, and every output names them alike."""
    import yaml

    from surgery.cli.main import main
    from tests.support.tokenizer import save_char_tokenizer

    def run(*args) -> str:
        main([str(a) for a in args])
        return capsys.readouterr().out

    src = save_char_tokenizer(tiny("qwen2_moe"), bos=True)
    info = json.loads(run("inspect", src, "--json"))
    assert (info["experts"], info["expert_width"], info["shared_expert_width"]) == (4, 16, 24)
    assert info["expert_layout"] == "one tensor per expert"
    dst = tmp_path / "pruned"
    run("prune-neurons", src, "--neurons", "1:e2:3,1:s:4,0:e0:15", "--out", dst)
    prov = json.loads((dst / "surgery.json").read_text())
    assert prov["verification"]["max_abs_logit_diff"] <= 1e-5
    assert prov["recipe"]["edits"][0] == {"type": "neuron", "layer": 1, "expert": 2, "neuron": 3, "factor": 0.0}
    card = (dst / "README.md").read_text()
    assert "`1:e2:3`" in card and "`1:s:4`" in card and "`0:e0:15`" in card
    # the recipe written from the bake applies again to the same bytes
    recipe = tmp_path / "again.yaml"
    recipe.write_text(yaml.safe_dump(prov["recipe"]), encoding="utf-8")
    run("apply", recipe, "--model", src, "--out", tmp_path / "again")
    assert _tensors(dst).keys() == _tensors(tmp_path / "again").keys()
    assert all(_equal(a, b) for a, b in zip(_tensors(dst).values(), _tensors(tmp_path / "again").values()))
    run("verify", src, dst)


def test_expert_scale_that_vanishes_in_bf16_is_refused(tiny, tmp_path):
    """The vanishing-scale check reads an expert's own slice, in both layouts."""
    from surgery.bake.guards import check_scales

    for fused in (False, True):
        ckpt = Checkpoint(tiny("mixtral", dtype=torch.bfloat16, fused=fused))
        tiny_scale, fine = NeuronScale(1, 4, 1e-45, 3), NeuronScale(1, 5, 0.5, 3)
        check_scales(ckpt, Recipe((fine,)))
        with pytest.raises(RecipeError, match="factor 1e-45 rounds every weight of neuron 1:e3:4 to zero in this BF16"):
            check_scales(ckpt, Recipe((tiny_scale, fine)))
        check_scales(ckpt, Recipe((tiny_scale, fine)), allow_zero=True)


@pytest.mark.parametrize("arch", ["mixtral", "gpt_oss"])
def test_fused_windows_in_small_blocks(tiny, tmp_path, monkeypatch, arch):
    """With blocks of a few rows, one expert's window is rewritten block by block (bounded memory):
    bytes, verify and undo as with one block; reads never leave the expert's window."""
    from surgery.bake import patches

    src = tiny(arch, fused=True)
    ckpt = Checkpoint(src)
    recipe = Recipe(_expert_edits(ckpt.config))
    bake(ckpt, recipe, tmp_path / "one-block")
    reads = []
    read_raw = patches.read_raw
    monkeypatch.setattr(patches, "CHUNK_BYTES", 768)  # 2 fp32 rows of 96, 4 of 48
    monkeypatch.setattr(patches, "read_raw", lambda fd, info, first, n, cols: reads.append((info, first, n, cols))
                        or read_raw(fd, info, first, n, cols))
    bake(ckpt, recipe, tmp_path / "blocks")
    assert any(n > 1 for _, _, n, _ in reads)
    for info, first, n, cols in reads:
        window = info.shape[1] if len(info.shape) == 3 else 1  # an expert's rows of the 2-D view
        assert n * cols * 4 <= 768 and first // window == (first + n - 1) // window < info.shape[0]
    one, blocks = _tensors(tmp_path / "one-block"), _tensors(tmp_path / "blocks")
    assert all(_equal(one[k], blocks[k]) for k in one)
    assert verify(ckpt, tmp_path / "blocks").ok
    undo(tmp_path / "blocks", tmp_path / "restored")


@pytest.mark.parametrize("arch", ["qwen2_moe", "gpt_oss"])
def test_twin_under_disk_offload(tiny, tmp_path, arch):
    """Every layer offloaded to disk by accelerate: the twin runs inside the experts' forward, where
    the weights are in place, and still equals the bake."""
    from transformers import AutoModelForCausalLM

    from surgery.model.hooks import applied

    src = tiny(arch)
    ckpt = Checkpoint(src)
    recipe = Recipe(_expert_edits(ckpt.config) + (HeadScale(0, 1, 2.5),))
    bake(ckpt, recipe, tmp_path / "baked")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, device_map="auto",
                                                 max_memory={"cpu": "1KB"}, offload_folder=tmp_path / "off").eval()
    experts = model.model.layers[0].mlp.experts
    assert experts.gate_up_proj.device.type == "meta"  # really offloaded
    ids = torch.randint(3, 90, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), applied(model, recipe.edits):
        twin = model(input_ids=ids).logits
    assert (twin - _logits(tmp_path / "baked")).abs().max().item() <= 1e-5


def test_fused_bake_counts_tensors_not_expert_windows(tiny, tmp_path, capsys):
    """Two experts' neurons of one fused layer change two tensors (gate_up_proj, down_proj), though
    the bake patches (and records for undo) one window per expert in each."""
    from surgery.cli.main import main

    src = tiny("mixtral", fused=True)
    main(["prune-neurons", str(src), "--neurons", "1:e0:3,1:e1:4", "--no-verify", "--out", str(tmp_path / "a")])
    assert "Baked 2 edit(s) into 2 tensor(s)" in capsys.readouterr().out
    main(["prune-neurons", str(src), "--neurons", "1:e0:3,1:e1:4", "--no-verify", "--json", "--out", str(tmp_path / "b")])
    assert json.loads(capsys.readouterr().out)["tensors_edited"] == 2
    assert len(json.loads((tmp_path / "b" / "surgery.json").read_text())["edited_tensors"]) == 4  # windows, for undo
