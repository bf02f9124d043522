"""Baked checkpoint == run-time twin, for every architecture in the table, sharded or not, fp32/bf16."""

from __future__ import annotations

import json

import pytest
import torch

from surgery.bake.bake import bake
from surgery.bake.undo import undo
from surgery.bake.verify import verify
from surgery.core.architectures import architecture
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.model.hooks import applied
from tests.support.models import load_fp32, logits, stored_tensors
from tests.support.tiny import ARCHS


def _recipe(config: dict) -> Recipe:
    g = architecture(config).geometry
    last = g.num_layers - 1
    return Recipe(
        (
            HeadScale(0, 1, 2.5),
            HeadScale(last, g.num_heads - 1, 0.5),
            NeuronScale(1, 3, 0.0),
            NeuronScale(1, g.intermediate_size - 1, 0.0),
            NeuronScale(last, 5, 0.5),
        )
    )


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("shard", [None, "20KB"], ids=["single", "sharded"])
def test_baked_equals_runtime_twin(tiny, tmp_path, arch, shard):
    src = tiny(arch, shard=shard)
    ckpt = Checkpoint(src)
    if shard:
        assert len(ckpt.weight_files) > 1
    recipe = _recipe(ckpt.config)
    dst = tmp_path / "baked"
    bake(ckpt, recipe, dst)

    # logits: baked == source + hooks (fp32)
    assert (logits(load_fp32(dst)) - logits(load_fp32(src), recipe.edits)).abs().max().item() <= 1e-5
    # hooks change something (the test would pass vacuously otherwise)
    assert (logits(load_fp32(src)) - logits(load_fp32(src), recipe.edits)).abs().max().item() > 1e-3

    # names, shapes, dtypes, config unchanged; only edited tensors differ
    before, after = stored_tensors(src), stored_tensors(dst)
    assert before.keys() == after.keys()
    edited = {e["tensor"] for e in json.loads((dst / "surgery.json").read_text())["edited_tensors"]}
    for name in before:
        assert before[name].shape == after[name].shape and before[name].dtype == after[name].dtype
        if name not in edited:
            assert torch.equal(
                before[name].view(torch.uint8) if before[name].dtype == torch.bfloat16 else before[name],
                after[name].view(torch.uint8) if after[name].dtype == torch.bfloat16 else after[name],
            ), name
    assert (src / "config.json").read_bytes() == (dst / "config.json").read_bytes()

    # stock loading: no missing / unexpected keys
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(dst, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]

    # verify passes; undo restores every file byte for byte
    assert verify(Checkpoint(src), dst).ok
    restored = tmp_path / "restored"
    undo(dst, restored)
    assert sorted(p.name for p in restored.iterdir()) == sorted(p.name for p in src.iterdir())
    for f in src.iterdir():
        assert file_sha256(f) == file_sha256(restored / f.name), f.name


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "phi3"])
def test_bf16_sharded(tiny, tmp_path, arch):
    src = tiny(arch, dtype=torch.bfloat16, shard="20KB")
    ckpt = Checkpoint(src)
    recipe = _recipe(ckpt.config)
    bake(ckpt, recipe, tmp_path / "baked")
    report = verify(ckpt, tmp_path / "baked")
    assert report.ok, report.problems
    # bf16 bake rounds α·W once; the twin computes on the unrounded weights
    assert report.max_abs_logit_diff <= report.tolerance
    undo(tmp_path / "baked", tmp_path / "restored")
    for f in src.iterdir():
        assert file_sha256(f) == file_sha256(tmp_path / "restored" / f.name)


def test_fp16(tiny, tmp_path):
    src = tiny("qwen2", dtype=torch.float16)
    bake(Checkpoint(src), _recipe(Checkpoint(src).config), tmp_path / "baked")
    assert verify(Checkpoint(src), tmp_path / "baked").ok


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_identity_edits_are_byte_identical(tiny, tmp_path, dtype):
    src = tiny("llama", dtype=dtype, shard="20KB")
    recipe = Recipe((HeadScale(0, 0, 1.0), NeuronScale(2, 7, 1.0)))
    bake(Checkpoint(src), recipe, tmp_path / "baked")
    for f in src.iterdir():
        assert file_sha256(f) == file_sha256(tmp_path / "baked" / f.name)


def test_pruned_neuron_is_dead_everywhere(tiny, tmp_path):
    src = tiny("llama")  # mlp_bias=True
    bake(Checkpoint(src), Recipe((NeuronScale(1, 3, 0.0),)), tmp_path / "baked")
    t = stored_tensors(tmp_path / "baked")
    p = "model.layers.1.mlp."
    assert not t[p + "down_proj.weight"][:, 3].any()
    for m in ("gate_proj", "up_proj"):
        assert not t[p + m + ".weight"][3].any() and t[p + m + ".bias"][3] == 0
    assert t[p + "gate_proj.weight"][4].any()


def test_phi3_fused_rows(tiny, tmp_path):
    src = tiny("phi3")
    bake(Checkpoint(src), Recipe((NeuronScale(0, 5, 0.0),)), tmp_path / "baked")
    w = stored_tensors(tmp_path / "baked")["model.layers.0.mlp.gate_up_proj.weight"]
    assert not w[5].any() and not w[48 + 5].any() and w[6].any() and w[48 + 6].any()


def test_tied_embeddings_untouched(tiny, tmp_path):
    src = tiny("gemma3_text", tie_word_embeddings=True)
    bake(Checkpoint(src), _recipe(Checkpoint(src).config), tmp_path / "baked")
    a, b = stored_tensors(src), stored_tensors(tmp_path / "baked")
    assert "lm_head.weight" not in b
    assert torch.equal(a["model.embed_tokens.weight"], b["model.embed_tokens.weight"])


def test_hub_cache_symlinks_copied_as_content(tiny, tmp_path):
    src = tiny("llama")
    snapshot = tmp_path / "snapshot"
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    snapshot.mkdir()
    for f in src.iterdir():
        (blobs / f.name).write_bytes(f.read_bytes())
        (snapshot / f.name).symlink_to(blobs / f.name)
    bake(Checkpoint(snapshot), Recipe((HeadScale(0, 0, 2.0),)), tmp_path / "baked")
    assert not any(p.is_symlink() for p in (tmp_path / "baked").iterdir())
    assert (blobs / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert verify(Checkpoint(snapshot), tmp_path / "baked").ok


def test_verify_detects_flipped_byte(tiny, tmp_path):
    src = tiny("llama")
    dst = tmp_path / "baked"
    bake(Checkpoint(src), Recipe((HeadScale(0, 0, 2.0),)), dst)
    data = bytearray((dst / "model.safetensors").read_bytes())
    data[-3] ^= 0x01
    (dst / "model.safetensors").write_bytes(bytes(data))
    report = verify(Checkpoint(src), dst)
    assert not report.ok and "sha256" in report.problems[0]


def test_runtime_hooks_leave_nothing_behind(tiny):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny("llama"))
    with pytest.raises(RuntimeError):
        with applied(model, [HeadScale(0, 0, 2.0), NeuronScale(1, 1, 0.0)]):
            raise RuntimeError("boom")
    assert all(not m._forward_pre_hooks for m in model.modules())


# --- weights in other formats are never published next to the edited ones ----------------------


def _with_other_weights(src):
    """Add a pickle, its index and a Meta-style original/ .pth next to the safetensors."""
    import pickle

    (src / "pytorch_model.bin").write_bytes(pickle.dumps({"unedited": 1}))
    (src / "pytorch_model.bin.index.json").write_text('{"weight_map": {}}')
    (src / "original").mkdir()
    (src / "original" / "consolidated.00.pth").write_bytes(pickle.dumps({"unedited": 2}))
    return src


def test_other_weight_files_are_left_out_with_a_note(tiny, tmp_path):
    from tests.support.cli import run_here

    src = _with_other_weights(tiny("llama"))
    out = tmp_path / "baked"
    result = run_here(["amplify-heads", src, "--heads", "0.1", "--alpha", "2", "--out", out, "--no-verify"])
    assert result.returncode == 0, result.stderr
    assert "note: left out original/consolidated.00.pth, pytorch_model.bin, pytorch_model.bin.index.json" in " ".join(
        result.stderr.split()
    )
    assert not list(out.rglob("*.bin")) and not list(out.rglob("*.pth"))
    assert not (out / "pytorch_model.bin.index.json").exists()
    prov = json.loads((out / "surgery.json").read_text())
    assert prov["undo"]["left_out_files"] == [
        "original/consolidated.00.pth",
        "pytorch_model.bin",
        "pytorch_model.bin.index.json",
    ]
    assert verify(Checkpoint(src), out, run_model=False).ok
    restored = run_here(["undo", out, "--out", tmp_path / "restored"])
    assert restored.returncode == 0, restored.stderr
    assert "pytorch_model.bin" in restored.stderr and "copy" in restored.stderr
    assert file_sha256(tmp_path / "restored" / "model.safetensors") == file_sha256(src / "model.safetensors")


def test_verify_fails_on_pickled_weights_in_the_output(tiny, tmp_path):
    from tests.support.cli import run_here

    src = tiny("llama")
    out = tmp_path / "baked"
    bake(Checkpoint(src), Recipe((HeadScale(0, 1, 2.0),)), out)
    (out / "pytorch_model.bin").write_bytes((src / "model.safetensors").read_bytes())
    result = run_here(["verify", src, out, "--structural-only"])
    assert result.returncode == 1
    fails = [ln for ln in result.stderr.splitlines() if ln.startswith("FAIL: ")]
    assert fails == [
        "FAIL: pytorch_model.bin holds weights in a format the bake does not edit (pickle, GGUF, "
        "TF or Flax): it is an unedited copy of the model that loaders may pick instead; delete it"
    ]


def test_verify_fails_on_other_weights_recorded_by_an_earlier_bake(tiny, tmp_path):
    """Bakes before this check copied a .bin and recorded its sha256: the seal holds, verify fails."""
    from surgery.bake.provenance import provenance_text

    src = tiny("llama")
    out = tmp_path / "baked"
    bake(Checkpoint(src), Recipe((HeadScale(0, 1, 2.0),)), out)
    (out / "model.gguf").write_bytes(b"GGUF")
    prov = json.loads((out / "surgery.json").read_text())
    prov["files"]["model.gguf"] = file_sha256(out / "model.gguf")
    (out / "surgery.json").write_text(provenance_text(prov))
    report = verify(Checkpoint(src), out, run_model=False)
    assert [p.split(" holds")[0] for p in report.problems] == ["model.gguf"]


# --- verify names the tensor and the rows/columns that do not hold the recipe's values ----------

O_PROJ = "model.layers.0.self_attn.o_proj.weight"


def _poke(folder, row: int, col: int, value: float) -> None:
    """Overwrite one F32 element of layer 0's o_proj in ``folder``/model.safetensors."""
    import struct

    info = Checkpoint(folder).tensor(O_PROJ)
    with open(folder / "model.safetensors", "r+b") as f:
        f.seek(info.start + (row * info.shape[1] + col) * 4)
        f.write(struct.pack("<f", value))


def _reseal(folder) -> None:
    """Record the current sha256 of every file in surgery.json and seal it again (a careful forger)."""
    from surgery.bake.provenance import provenance_text

    prov = json.loads((folder / "surgery.json").read_text())
    prov["files"] = {n: file_sha256(folder / n) for n in prov["files"]}
    (folder / "surgery.json").write_text(provenance_text(prov))


@pytest.fixture
def head_bake(tiny, tmp_path):
    """A tiny F32 llama and its bake of head 0.1 × 2 (o_proj columns 8–15 of layer 0)."""
    src = tiny("llama")
    out = tmp_path / "baked"
    bake(Checkpoint(src), Recipe((HeadScale(0, 1, 2.0),)), out)
    return src, out


def test_verify_locates_a_tampered_edited_slice(head_bake):
    from tests.support.cli import run_here

    src, out = head_bake
    _poke(out, 5, 9, 123.0)
    _poke(out, 6, 9, 123.0)
    _reseal(out)
    result = run_here(["verify", src, out, "--structural-only"])
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if " elapsed" not in line] == [  # progress lines aside
        f"FAIL: model.safetensors: tensor '{O_PROJ}' differs from what the recipe prescribes at rows 5–6, "
        "columns 9; the output was changed after the bake (and surgery.json re-sealed to match): bake it again"
    ]

    as_json = run_here(["verify", src, out, "--structural-only", "--json"])
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert report["ok"] is False and len(report["problems"]) == 1
    assert report["mismatches"] == [
        {"file": "model.safetensors", "tensor": O_PROJ, "rows": [5, 6], "columns": [9], "source_changed": False}
    ]


def test_verify_tells_a_source_edited_since_the_bake(head_bake, tmp_path):
    import shutil

    src, out = head_bake
    edited = tmp_path / "edited-source"
    shutil.copytree(src, edited)
    _poke(edited, 0, 15, 0.5)  # inside the recipe's columns: only the edited slice can disagree
    report = verify(Checkpoint(edited), out, run_model=False)
    assert not report.ok
    assert report.problems[0].startswith(
        f"model.safetensors: tensor '{O_PROJ}' differs from what the recipe "
        "prescribes at rows 0, columns 15; the source's model.safetensors is "
        "not the one this folder was baked from"
    )
    assert report.mismatches[0]["source_changed"] is True


def test_verify_says_plainly_that_the_source_changed_outside_the_edited_slices(head_bake, tmp_path):
    """A source changed after the bake is said to be so, not reported as a damaged output (before:
    "model.safetensors: byte N differs from the source outside the edited slices")."""
    import shutil

    from surgery.bake.verify import source_changed_line

    src, out = head_bake
    for changed in ("model.safetensors", "generation_config.json", "config.json"):
        edited = tmp_path / f"edited-{changed}"
        shutil.copytree(src, edited)
        if changed == "model.safetensors":  # a tensor the recipe does not touch
            start = Checkpoint(edited).tensor("model.layers.1.self_attn.q_proj.weight").start
            with open(edited / changed, "r+b") as f:
                f.seek(start)
                f.write(b"\x00\x00\xc0\x3f")
        else:
            (edited / changed).write_text((edited / changed).read_text().replace("{", '{"_note": 1, ', 1))
        report = verify(Checkpoint(edited), out, run_model=False)
        assert report.problems == [source_changed_line(changed)], changed
        assert report.problems[0].startswith(
            f"the source's {changed} no longer matches the sha256 recorded at bake time"
        )


def test_verify_against_another_architecture_says_so_in_one_line(head_bake, tiny):
    """Not one "no longer matches the sha256" line per source file: the source is another model."""
    src, out = head_bake
    other = tiny("qwen2")
    report = verify(Checkpoint(other), out, run_model=False)
    assert report.problems == [
        f"{other} is a qwen2 model, but {out} was baked from {src.name}, a llama model: "
        "give the source this folder was baked from"
    ]


def test_edited_shards_streamed_at_once_give_one_layout(tiny, tmp_path, monkeypatch):
    """Edited shards stream on two threads; surgery.undo and the edit records must not depend on
    which shard ends first (slow down the first shard so that the others finish before it)."""
    import time

    import surgery.bake.bake as bake_module

    src = tiny("llama", shard="20KB")
    ckpt = Checkpoint(src)
    recipe = _recipe(ckpt.config)
    bake(ckpt, recipe, tmp_path / "a")
    first = sorted(bake_module.group_by_file(ckpt.format.plan(ckpt, architecture(ckpt.config), recipe.active())))[0]
    original = bake_module._patch_file

    def late_first(src_file, *args, **kwargs):
        if src_file.name == first:
            time.sleep(0.5)
        return original(src_file, *args, **kwargs)

    monkeypatch.setattr(bake_module, "_patch_file", late_first)
    bake(ckpt, recipe, tmp_path / "b")
    assert file_sha256(tmp_path / "a" / "surgery.undo") == file_sha256(tmp_path / "b" / "surgery.undo")
    edited = [json.loads((tmp_path / d / "surgery.json").read_text())["edited_tensors"] for d in "ab"]
    assert edited[0] == edited[1] and len({e["file"] for e in edited[0]}) > 1


def test_a_failing_shard_stops_the_others(tiny, tmp_path, monkeypatch):
    """One edited shard fails: its error is the bake's, the shard streaming beside it stops at its
    next block, and nothing is left behind."""
    import time

    import surgery.bake.bake as bake_module

    src = tiny("llama", shard="20KB")
    ckpt = Checkpoint(src)
    recipe = _recipe(ckpt.config)
    files = sorted(bake_module.group_by_file(ckpt.format.plan(ckpt, architecture(ckpt.config), recipe.active())))
    original, outcome = bake_module._patch_file, {}

    def failing(src_file, *args, **kwargs):
        if src_file.name == files[1]:
            raise OSError(28, "No space left on device")
        if src_file.name == files[0]:  # still streaming when files[1] fails
            time.sleep(0.5)
            try:
                return original(src_file, *args, **kwargs)
            except Exception as exc:
                outcome["first"] = str(exc)
                raise
        return original(src_file, *args, **kwargs)

    monkeypatch.setattr(bake_module, "_patch_file", failing)
    (tmp_path / "outs").mkdir()
    with pytest.raises(Exception, match="no space left"):
        bake(ckpt, recipe, tmp_path / "outs" / "baked")
    assert list((tmp_path / "outs").iterdir()) == []
    assert "another shard failed" in outcome["first"]
