"""Hashing policy: every byte hashed at most once, and surgery.json says which hashes were taken."""

from __future__ import annotations

import json

import pytest

import surgery.bake.bake as bake_module
import surgery.bake.stream as stream_module
from surgery.bake.bake import bake
from surgery.bake.undo import undo
from surgery.bake.verify import verify
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import HeadScale, Recipe

RECIPE = Recipe((HeadScale(0, 1, 2.5),))  # one shard of a sharded tiny model is edited


def _snapshot(src, root, lie: str | None = None):
    """A Hub-cache layout: snapshot files link to blobs named by their sha256 (``lie``: that file's
    blob gets a wrong name)."""
    snapshot, blobs = root / "snapshots" / "abc", root / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for f in sorted(src.iterdir()):
        name = "0" * 64 if f.name == lie else file_sha256(f)
        (blobs / name).write_bytes(f.read_bytes())
        (snapshot / f.name).symlink_to(blobs / name)
    return snapshot


def _hashed(monkeypatch) -> list[str]:
    """Names of the files bake hashes by reading them back (not in the pass that writes them)."""
    seen: list[str] = []
    real = bake_module.file_sha256
    monkeypatch.setattr(bake_module, "file_sha256", lambda path, *a: seen.append(path.name) or real(path, *a))
    return seen


def test_local_source_every_file_hashed_once(tiny, tmp_path, monkeypatch):
    src = tiny("llama", shard="20KB")
    seen = _hashed(monkeypatch)
    prov = bake(Checkpoint(src), RECIPE, tmp_path / "baked").provenance.to_dict()
    edited = {e["file"] for e in prov["edited_tensors"]}
    shards = sorted(p.name for p in src.glob("*.safetensors"))
    assert len(edited) == 1 and len(shards) > 1
    # the edited shard: hashed while written (source and output); every other file once, as the source
    assert sorted(seen) == sorted([p.name for p in src.iterdir() if p.name not in edited] + ["surgery.undo"])
    for name in shards:
        assert prov["source_files"][name] == file_sha256(src / name)
        assert prov["files"][name] == file_sha256(tmp_path / "baked" / name)
    assert prov["hashing"]["source_files_from_hub_blob_names"] == []
    assert sorted(prov["hashing"]["files_from_source"]) == sorted(p.name for p in src.iterdir() if p.name not in edited)
    assert verify(Checkpoint(src), tmp_path / "baked", run_model=False).ok
    undo(tmp_path / "baked", tmp_path / "undone")
    assert {p.name: file_sha256(p) for p in (tmp_path / "undone").iterdir()} == {
        p.name: file_sha256(p) for p in src.iterdir()
    }


def test_hub_cache_source_takes_blob_names(tiny, tmp_path, monkeypatch):
    src = tiny("llama", shard="20KB")
    snapshot = _snapshot(src, tmp_path / "hub")
    seen = _hashed(monkeypatch)
    prov = bake(Checkpoint(snapshot), RECIPE, tmp_path / "baked").provenance.to_dict()
    assert seen == ["surgery.undo"]  # nothing of the source is read for hashing; the edited shard in its pass
    assert prov["hashing"]["source_files_from_hub_blob_names"] == sorted(p.name for p in src.iterdir())
    assert prov["source_files"] == {p.name: file_sha256(p) for p in src.iterdir()}
    assert verify(Checkpoint(snapshot), tmp_path / "baked", run_model=False).ok


@pytest.mark.parametrize("lied", ["config.json", "edited"])
def test_verify_recomputes_taken_hashes(tiny, tmp_path, lied):
    """A blob whose name is not its sha256 is taken at bake time; verify recomputes and says so."""
    src = tiny("llama", shard="20KB")
    edited = bake(Checkpoint(src), RECIPE, tmp_path / "probe").provenance.edited_tensors[0].file
    snapshot = _snapshot(src, tmp_path / "hub", lie=edited if lied == "edited" else lied)
    bake(Checkpoint(snapshot), RECIPE, tmp_path / "baked")
    report = verify(Checkpoint(snapshot), tmp_path / "baked", run_model=False)
    assert not report.ok
    if lied == "config.json":  # copied untouched: its recorded hash is the (wrong) taken one
        assert any("config.json changed after the bake (sha256" in p for p in report.problems)
    else:
        assert any(f"source's {edited} that its content does not have" in p for p in report.problems)
    prov = json.loads((tmp_path / "baked" / "surgery.json").read_text())
    assert prov["source_files"][lied if lied != "edited" else edited] == "0" * 64


@pytest.mark.parametrize("block", [997, 2048])
def test_streamed_shard_is_the_same_for_any_block_size(tiny, tmp_path, monkeypatch, block):
    """Small blocks: patches straddle block edges, buffers are reused many times."""
    import torch

    from surgery.core.edits import NeuronScale

    src = tiny("llama", dtype=torch.bfloat16)
    recipe = Recipe((HeadScale(0, 1, 2.5), NeuronScale(1, 3, 0.0), NeuronScale(2, 5, 0.5)))
    ref = bake(Checkpoint(src), recipe, tmp_path / "ref").provenance.to_dict()
    monkeypatch.setattr(stream_module, "STREAM_BLOCK", block)
    got = bake(Checkpoint(src), recipe, tmp_path / "small").provenance.to_dict()
    assert (src / "model.safetensors").stat().st_size > 30 * block
    assert got["files"] == ref["files"] and got["source_files"] == ref["source_files"]
    assert got["files"]["model.safetensors"] == file_sha256(tmp_path / "small" / "model.safetensors")
    assert verify(Checkpoint(src), tmp_path / "small", run_model=False).ok


@pytest.mark.parametrize("kernel", ["copies", "refuses", "absent"])
def test_stream_writes_the_same_bytes_whether_the_kernel_copies_or_not(tmp_path, monkeypatch, kernel):
    """Blocks no patch lands in go through copy_file_range; where the kernel refuses it (another
    filesystem, a device) or the OS lacks it, pwrite writes them: the same file and hashes either way."""
    import errno
    import hashlib
    import os

    data = os.urandom(10 * 4096 + 123)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    patches = [(5000, b"\x00" * 300), (9 * 4096 + 7, b"\xff" * 50)]
    want = bytearray(data)
    for offset, new in patches:
        want[offset : offset + len(new)] = new
    monkeypatch.setattr(stream_module, "STREAM_BLOCK", 4096)
    kernel_calls, writes = [], []
    real_copy, real_pwrite = getattr(os, "copy_file_range", None), os.pwrite
    if kernel == "absent":
        monkeypatch.delattr(os, "copy_file_range", raising=False)
    else:
        if real_copy is None:
            pytest.skip("no copy_file_range on this OS")

        def copy_file_range(*args):
            kernel_calls.append(args[3])
            if kernel == "refuses":
                raise OSError(errno.EXDEV, "cross-device")
            return real_copy(*args)

        monkeypatch.setattr(os, "copy_file_range", copy_file_range)

    def pwrite(fd, block, offset):
        writes.append(offset)
        return real_pwrite(fd, block, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)

    def new_bytes(fd):  # a generator, as the bakes pass
        yield from patches

    src_sha, out_sha = stream_module.stream_patched(src, tmp_path / "out.bin", new_bytes)
    assert (tmp_path / "out.bin").read_bytes() == bytes(want)
    assert (src_sha, out_sha) == (hashlib.sha256(data).hexdigest(), hashlib.sha256(want).hexdigest())
    patched_blocks = [4096, 9 * 4096]  # the blocks the two patches land in
    if kernel == "copies":  # every other block went through the kernel, the patched ones through pwrite
        assert writes == patched_blocks
        assert kernel_calls == [i * 4096 for i in range(11) if i * 4096 not in patched_blocks]
    elif kernel == "refuses":  # asked once, then every block written by pwrite
        assert kernel_calls == [0] and writes == [i * 4096 for i in range(11)]
    else:
        assert writes == [i * 4096 for i in range(11)]
