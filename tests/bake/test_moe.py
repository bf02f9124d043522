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
from surgery.bake.check import edited_check, edited_maps
from surgery.bake.undo import undo
from surgery.bake.verify import verify
from surgery.core.architectures import architecture
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import SHARED, HeadScale, NeuronScale, Recipe
from surgery.core.errors import RecipeError
from tests.support.models import load_fp32, logits, stored_tensors
from tests.support.tiny import MOE_ARCHS

# save_pretrained writes GPT-OSS fused already: its "per-expert" case would repeat the fused one.
CASES = [(a, f) for a in MOE_ARCHS for f in (False, True) if not (a == "gpt_oss" and not f)]


def _expert_edits(config: dict) -> tuple[NeuronScale, ...]:
    """Pruned and scaled neurons of several experts, the last expert's last neuron included."""
    g = architecture(config).geometry
    last = g.num_layers - 1
    return (
        NeuronScale(0, 3, 0.0, 1),
        NeuronScale(1, g.expert_size - 1, 0.0, g.num_experts - 1),
        NeuronScale(1, 5, 2.5, 2),
        NeuronScale(last, 7, 0.0, 0),
        NeuronScale(last, 8, 0.5, 0),
    )


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

    base = logits(load_fp32(src))
    # the expert edits alone change the output (the twin is not vacuous), and so does the rest
    assert (base - logits(load_fp32(src), experts)).abs().max().item() > 1e-3
    assert (logits(load_fp32(dst)) - logits(load_fp32(src), recipe.edits)).abs().max().item() <= 1e-5

    before, after = stored_tensors(src), stored_tensors(dst)
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
    before, after = stored_tensors(src), stored_tensors(tmp_path / "baked")
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
    before, after = stored_tensors(src), stored_tensors(tmp_path / "baked")
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


def test_cli_prunes_named_expert_neurons_and_says_so(tiny, tmp_path, capsys, monkeypatch):
    """prune-neurons --neurons L:eE:N,L:s:N bakes, checks the edited slices (no model loaded once the
    source ran before a first bake), and every output names them alike."""
    import transformers
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
    run("prune-neurons", src, "--neurons", "0:e1:1", "--out", tmp_path / "first")  # the source runs once here
    with monkeypatch.context() as m:
        m.setattr(transformers.AutoModelForCausalLM, "from_pretrained", None)  # a model load would fail
        run("prune-neurons", src, "--neurons", "1:e2:3,1:s:4,0:e0:15", "--out", dst)
    prov = json.loads((dst / "surgery.json").read_text())
    ver = prov["verification"]
    # routed e2 and e0 (down, gate, up each), the shared expert's down, gate and up
    assert ver["kind"] == "edited maps" and ver["maps"] == 9 and ver["max_abs_diff"] <= 1e-5
    assert prov["recipe"]["edits"][0] == {"type": "neuron", "layer": 1, "expert": 2, "neuron": 3, "factor": 0.0}
    card = (dst / "README.md").read_text()
    assert "`1:e2:3`" in card and "`1:s:4`" in card and "`0:e0:15`" in card
    # the recipe written from the bake applies again to the same bytes
    recipe = tmp_path / "again.yaml"
    recipe.write_text(yaml.safe_dump(prov["recipe"]), encoding="utf-8")
    run("apply", recipe, "--model", src, "--out", tmp_path / "again")
    assert stored_tensors(dst).keys() == stored_tensors(tmp_path / "again").keys()
    assert all(_equal(a, b) for a, b in zip(stored_tensors(dst).values(), stored_tensors(tmp_path / "again").values()))
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
    from surgery.core import patches

    src = tiny(arch, fused=True)
    ckpt = Checkpoint(src)
    recipe = Recipe(_expert_edits(ckpt.config))
    bake(ckpt, recipe, tmp_path / "one-block")
    reads = []
    read_raw = patches.read_raw
    monkeypatch.setattr(patches, "CHUNK_BYTES", 768)  # 2 fp32 rows of 96, 4 of 48
    monkeypatch.setattr(
        patches,
        "read_raw",
        lambda fd, info, first, n, cols: reads.append((info, first, n, cols)) or read_raw(fd, info, first, n, cols),
    )
    bake(ckpt, recipe, tmp_path / "blocks")
    assert any(n > 1 for _, _, n, _ in reads)
    for info, first, n, cols in reads:
        window = info.shape[1] if len(info.shape) == 3 else 1  # an expert's rows of the 2-D view
        assert n * cols * 4 <= 768 and first // window == (first + n - 1) // window < info.shape[0]
    one, blocks = stored_tensors(tmp_path / "one-block"), stored_tensors(tmp_path / "blocks")
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
    model = AutoModelForCausalLM.from_pretrained(
        src, dtype=torch.float32, device_map="auto", max_memory={"cpu": "1KB"}, offload_folder=tmp_path / "off"
    ).eval()
    experts = model.model.layers[0].mlp.experts
    assert experts.gate_up_proj.device.type == "meta"  # really offloaded
    ids = torch.randint(3, 90, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), applied(model, recipe.edits):
        twin = model(input_ids=ids).logits
    assert (twin - logits(load_fp32(tmp_path / "baked"))).abs().max().item() <= 1e-5


# --- the bake's own check reads the experts' slices: no model ---------------------------------------

CHECKED = [(a, f, torch.float32) for a, f in CASES] + [
    ("mixtral", True, torch.bfloat16),
    ("qwen3_moe", False, torch.bfloat16),
    ("gpt_oss", True, torch.bfloat16),
]


@pytest.fixture
def no_model(monkeypatch):
    """Any model load fails the test: the bake and its check must not need one."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("the bake loaded a model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


@pytest.mark.parametrize(
    "arch,fused,dtype", CHECKED, ids=[f"{a}-{'fused' if f else 'per-expert'}-{str(d)[6:]}" for a, f, d in CHECKED]
)
def test_expert_check_passes_good_bakes_without_the_model(tiny, tmp_path, no_model, arch, fused, dtype):
    src = tiny(arch, dtype=dtype, fused=fused)
    ckpt = Checkpoint(src)
    recipe = Recipe(_expert_edits(ckpt.config))
    bake(ckpt, recipe, tmp_path / "baked", check=edited_check(ckpt, recipe))
    ver = json.loads((tmp_path / "baked" / "surgery.json").read_text())["verification"]
    # 4 (layer, expert) edited, 3 of them pruned: their down columns, and gate and up rows — one
    # tensor each per expert, or the one fused gate_up window
    assert ver["kind"] == "edited maps" and ver["maps"] == (7 if fused or arch == "gpt_oss" else 10)
    assert ver["max_diff_over_bound"] <= 1.0
    if dtype == torch.float32:
        assert ver["max_abs_diff"] <= 1e-5
    else:  # the scales 2.5 and 0.5 of bf16 weights: 2.5 rounds, and the check allows it
        assert ver["max_abs_diff"] > 0


def test_expert_maps_follow_each_layout(tiny):
    """Per-expert tensors, Mixtral's fused [E, 2I, H] window (gate rows j, up rows I+j) and GPT-OSS's
    [E, H, 2I] window stored [in, out] with gate/up interleaved (2j, 2j+1) and their bias."""
    prune = Recipe((NeuronScale(0, 3, 0.0, 1),))
    per_expert = {(m.weight, m.axis): m for m in edited_maps(Checkpoint(tiny("mixtral")), prune)}
    w1 = per_expert[("model.layers.0.block_sparse_moe.experts.1.w1.weight", "out")]
    assert w1.scales == {3: 0.0} and w1.expert is None and w1.bias is None
    assert per_expert[("model.layers.0.block_sparse_moe.experts.1.w2.weight", "in")].scales == {3: 0.0}
    ckpt = Checkpoint(tiny("mixtral", fused=True))
    width = architecture(ckpt.config).geometry.expert_size
    fused = {(m.weight, m.axis): m for m in edited_maps(ckpt, prune)}
    gate_up = fused[("model.layers.0.mlp.experts.gate_up_proj", "out")]
    assert gate_up.scales == {3: 0.0, width + 3: 0.0} and gate_up.expert == 1 and not gate_up.flipped
    oss = {(m.weight, m.axis): m for m in edited_maps(Checkpoint(tiny("gpt_oss")), prune)}
    gate_up = oss[("model.layers.0.mlp.experts.gate_up_proj", "out")]
    assert gate_up.scales == {6: 0.0, 7: 0.0} and gate_up.expert == 1 and gate_up.flipped
    assert gate_up.bias == "model.layers.0.mlp.experts.gate_up_proj_bias"
    down = oss[("model.layers.0.mlp.experts.down_proj", "in")]
    assert down.scales == {3: 0.0} and down.flipped and down.bias is None


def _poke(path, p) -> None:
    """Write 7.0 over the first edited element of patch ``p`` in ``path`` (a bake bug, or bit rot)."""
    import numpy as np

    from surgery.core.raw_values import RAW_DTYPES, from_f32

    itemsize = np.dtype(RAW_DTYPES[p.info.dtype]).itemsize
    row, col = (min(p.rows), 0) if p.rows else (0, min(p.cols))
    with open(path, "r+b") as f:
        f.seek(p.info.start + ((p.first_row + row) * p.n_cols + col) * itemsize)
        f.write(from_f32(np.array([7.0], dtype=np.float32), p.info.dtype).tobytes())


TAMPERED = [
    ("mixtral", False, ".w2.weight"),
    ("qwen3_moe", False, ".up_proj.weight"),
    ("mixtral", True, "gate_up_proj"),
    ("gpt_oss", True, "gate_up_proj_bias"),
    ("gpt_oss", True, "down_proj"),
]


@pytest.mark.parametrize("arch,fused,tensor", TAMPERED, ids=[f"{a}-{t.strip('.')}" for a, f, t in TAMPERED])
def test_a_corrupted_expert_slice_fails_the_check(tiny, tmp_path, no_model, arch, fused, tensor):
    from surgery.core.errors import SurgeryError
    from surgery.core.patches import patch_plan

    src = tiny(arch, fused=fused)
    ckpt = Checkpoint(src)
    recipe = Recipe(_expert_edits(ckpt.config))
    target = next(
        p for p in patch_plan(ckpt, architecture(ckpt.config), recipe.active()) if p.info.name.endswith(tensor)
    )
    check = edited_check(ckpt, recipe)

    def tampered(staged):
        _poke(staged / target.info.file, target)
        return check(staged)

    before = {f.name: file_sha256(f) for f in src.iterdir()}
    with pytest.raises(SurgeryError, match=r"does not compute the run-time edit"):
        bake(ckpt, recipe, tmp_path / "baked", check=tampered)
    assert not (tmp_path / "baked").exists() and not list(tmp_path.glob(".baked*"))
    assert {f.name: file_sha256(f) for f in src.iterdir()} == before


def test_fused_bake_counts_tensors_not_expert_windows(tiny, tmp_path, capsys):
    """Two experts' neurons of one fused layer change two tensors (gate_up_proj, down_proj), though
    the bake patches (and records for undo) one window per expert in each."""
    from surgery.cli.main import main

    src = tiny("mixtral", fused=True)
    main(["prune-neurons", str(src), "--neurons", "1:e0:3,1:e1:4", "--no-verify", "--out", str(tmp_path / "a")])
    assert "Baked 2 edits into 2 tensors" in capsys.readouterr().out
    main(
        ["prune-neurons", str(src), "--neurons", "1:e0:3,1:e1:4", "--no-verify", "--json", "--out", str(tmp_path / "b")]
    )
    assert json.loads(capsys.readouterr().out)["tensors_edited"] == 2
    assert len(json.loads((tmp_path / "b" / "surgery.json").read_text())["edited_tensors"]) == 4  # windows, for undo
    main(["verify", str(src), str(tmp_path / "b")])  # said "4 edited tensors" where the bake said 2
    assert ", 2 edited tensors match the source" in capsys.readouterr().out
