"""stream_patched: the same bytes and sha256s as overlaying the patches in memory, whichever grains the
patches land in; only those grains pass through a buffer; a source that shrinks is an error."""

from __future__ import annotations

import hashlib
import os
import random

import pytest

import surgery.bake.stream as stream_module
import surgery.bake.stream_hash as hash_module

GRAIN, BLOCK = 4096, 4 * 4096


@pytest.fixture
def small_blocks(monkeypatch):
    """Grains of 4 KB, buffers of four grains, 1 KB hash slices: every edge is crossed many times."""
    monkeypatch.setattr(stream_module, "PATCH_GRAIN", GRAIN)
    monkeypatch.setattr(stream_module, "STREAM_BLOCK", BLOCK)
    monkeypatch.setattr(hash_module, "HASH_SLICE", 1024)


def _run(tmp_path, data: bytes, patches: list[tuple[int, bytes]], hash_source: bool):
    src, out = tmp_path / "src.bin", tmp_path / "out.bin"
    src.write_bytes(data)
    want = bytearray(data)
    for offset, new in patches:
        want[offset : offset + len(new)] = new

    def new_bytes(fd):  # a generator, as the bakes pass
        for offset, new in patches:
            yield offset, memoryview(new)

    got = stream_module.stream_patched(src, out, new_bytes, hash_source=hash_source)
    assert out.read_bytes() == bytes(want)
    source_sha = hashlib.sha256(data).hexdigest() if hash_source else None
    assert got == (source_sha, hashlib.sha256(want).hexdigest())


EDGE_CASES = {
    "no patch": [],
    "at 0": [(0, b"\x01" * 10)],
    "last byte": [(40 * GRAIN + 99, b"\x02")],
    "ends at a grain edge": [(GRAIN - 5, b"\x03" * 5)],
    "starts at a grain edge": [(2 * GRAIN, b"\x04" * 7)],
    "spans two grains": [(3 * GRAIN - 3, b"\x05" * 6)],
    "spans buffers": [(GRAIN + 1, b"\x06" * (3 * BLOCK))],  # longer than one buffer: goes on in the next
    "neighbouring grains": [(GRAIN * k + 11, b"\x07" * 3) for k in range(9)],  # more grains than one buffer holds
    "one grain apart": [(5 * GRAIN, b"\x08"), (7 * GRAIN + 1, b"\x09")],
    "far apart": [(100, b"\x0a" * 4), (30 * GRAIN, b"\x0b" * 4), (40 * GRAIN + 90, b"\x0c" * 10)],
}


@pytest.mark.parametrize("hash_source", [False, True])
@pytest.mark.parametrize("case", EDGE_CASES)
def test_patches_anywhere_give_the_overlaid_bytes_and_their_hashes(tmp_path, small_blocks, case, hash_source):
    _run(tmp_path, os.urandom(40 * GRAIN + 100), EDGE_CASES[case], hash_source)


@pytest.mark.parametrize("kernel", ["copies", "refuses"])
@pytest.mark.parametrize("seed", range(6))
def test_random_patches_give_the_overlaid_bytes_and_their_hashes(tmp_path, small_blocks, monkeypatch, seed, kernel):
    """Where the kernel refuses to copy (another filesystem, /dev/null as verify writes to), every
    stretch goes through a buffer, and both hashes read it there."""
    if kernel == "refuses":
        monkeypatch.setattr(stream_module, "kernel_copy", lambda *args: False)
    rng = random.Random(seed)
    size = rng.randrange(1, 60 * GRAIN)
    patches, pos = [], rng.randrange(0, 3 * GRAIN)
    while pos < size:
        n = min(size - pos, rng.choice([1, 144, GRAIN, BLOCK + 7]))
        patches.append((pos, rng.randbytes(n)))
        pos += n + rng.choice([0, 1, 8064, 5 * GRAIN])
    _run(tmp_path, rng.randbytes(size), patches, hash_source=seed % 2 == 0)


def test_an_empty_file(tmp_path, small_blocks):
    _run(tmp_path, b"", [], hash_source=True)


@pytest.mark.parametrize("hash_source", [False, True])
def test_only_the_grains_patches_land_in_pass_through_a_buffer(tmp_path, small_blocks, monkeypatch, hash_source):
    """The rest is kernel-copied and hashed from the source: no user-space copy of it in the stream."""
    if not hasattr(os, "copy_file_range"):
        pytest.skip("no copy_file_range on this OS")
    reads: list[tuple[int, int]] = []
    real = stream_module._read_exactly
    monkeypatch.setattr(
        stream_module,
        "_read_exactly",
        lambda fd, block, pos, name: reads.append((pos, len(block))) or real(fd, block, pos, name),
    )
    patches = [(GRAIN + 5, b"\x01"), (2 * GRAIN + 9, b"\x02"), (20 * GRAIN, b"\x03" * (GRAIN + 1))]
    _run(tmp_path, os.urandom(40 * GRAIN), patches, hash_source)
    # grains 1-2 together (neighbours), then 20-21 (the patch runs one byte into grain 21)
    assert reads == [(GRAIN, 2 * GRAIN), (20 * GRAIN, 2 * GRAIN)]


@pytest.mark.parametrize("hash_source", [False, True])
@pytest.mark.parametrize("where", ["before the patch", "after the patch", "no patch"])
def test_a_source_shorter_than_its_size_said_is_an_error(tmp_path, small_blocks, where, hash_source):
    """The file shrinks after its size was read (another process truncated it): an error, not a short output."""
    size = 30 * GRAIN
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(size))
    patch = {"before the patch": 20 * GRAIN, "after the patch": 2 * GRAIN, "no patch": None}[where]

    def new_bytes(fd):
        os.truncate(src, 10 * GRAIN)
        if patch is not None:
            yield patch, memoryview(b"\x00" * 8)

    with pytest.raises(OSError, match="ended early"):
        stream_module.stream_patched(src, tmp_path / "out.bin", new_bytes, hash_source=hash_source)


def test_a_patch_past_the_end_is_refused(tmp_path, small_blocks):
    from surgery.core.errors import CheckpointError

    with pytest.raises(CheckpointError, match="past the end of the file"):
        _run(tmp_path, os.urandom(3 * GRAIN), [(3 * GRAIN + 10, b"\x00")], hash_source=True)
