"""Stream a file to a new one with some byte ranges replaced, hashing both sides in the same pass: the
primitive under every bake that edits bytes in place (safetensors shards, GGUF files) and under GGUF verify."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import ExitStack
from pathlib import Path

from ..core.errors import CheckpointError
from ..core.kernel_copy import kernel_copy
from .stream_hash import FileHasher

STREAM_BLOCK = 16 << 20  # the most bytes copied, or read through memory, at a time
PATCH_GRAIN = 1 << 20  # a patch brings this much of the file around it through memory (aligned)
HASH_LAG = 4  # blocks the hashes may trail the copy by: what they read is still in the page cache

Patch = tuple[int, memoryview]


def stream_patched(
    src: Path,
    dst: Path,
    new_bytes: Callable[[int], Iterator[Patch]],
    hash_source: bool = True,
    on_bytes: Callable[[int], None] = lambda n: None,
    stop: threading.Event | None = None,
) -> tuple[str | None, str]:
    """Write ``src`` to ``dst`` with ``new_bytes(fd_src)``'s (offset, bytes) overlaid (in file order,
    disjoint), in one streaming pass; return the sha256 of the source (when ``hash_source``) and of
    the output. A set ``stop`` (another shard failed) ends the pass early with an error.

    Only the ``PATCH_GRAIN``-aligned stretches that patches land in pass through a buffer (read,
    overlaid, written, hashed from it). Every other stretch is written by the kernel
    (``copy_file_range``, page cache to page cache, as ``cp`` does) and hashed on a thread straight
    from the source in cache-sized slices, a few blocks behind the copy. Each sha256 runs on its own
    thread (hashlib releases the GIL); on a first bake the two are one hash until the first patch,
    which the output's hash copies there. Memory: two 16 MB buffers, and only where patches land.
    """
    size = os.stat(src).st_size
    dst.parent.mkdir(parents=True, exist_ok=True)
    with ExitStack() as closing:
        fd_src = os.open(src, os.O_RDONLY)
        closing.callback(os.close, fd_src)
        fd_dst = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        closing.callback(os.close, fd_dst)
        chunks = new_bytes(fd_src)
        # Closed here, on an error too: left to the garbage collector, it would end (leave its numpy
        # errstate) in another thread's context, which numpy rejects with a traceback.
        closing.callback(chunks.close)
        out_h = closing.enter_context(FileHasher(fd_src, src.name, HASH_LAG, STREAM_BLOCK))
        # A first bake hashes the source on its own thread; until the first patch, the output's bytes
        # are the source's, so that hash alone covers both, and the output's hash starts as its copy.
        src_h = closing.enter_context(FileHasher(fd_src, src.name, HASH_LAG, STREAM_BLOCK)) if hash_source else None
        shared = src_h is not None
        pending = next(chunks, None)
        buffers: list[bytearray] = []  # made at the first patch: a file without one never needs them
        buffer_jobs: list[list[Future]] = [[], []]  # the hashes reading each buffer, until they are done
        pos, turn = 0, 0
        use_kernel = True  # until the kernel refuses to copy between these files
        grain = min(PATCH_GRAIN, STREAM_BLOCK)
        while pos < size:
            if stop is not None and stop.is_set():
                raise CheckpointError(f"{src.name}: stopped, another shard failed")
            end = min(size, pos + STREAM_BLOCK)
            if pending is not None:  # copied up to the grain the next patch lands in
                end = min(end, pending[0] - pending[0] % grain)
            overlays: list[Patch] = []
            if end <= pos:
                end, pending = _gather(chunks, pending, pos, grain, size, overlays)
            if not overlays and use_kernel:
                use_kernel = kernel_copy(fd_src, fd_dst, pos, pos, end - pos)
            block = None
            if overlays or not use_kernel:  # through a buffer
                if not buffers:
                    buffers = [bytearray(STREAM_BLOCK) for _ in range(2)]
                for job in buffer_jobs[turn]:
                    job.result()
                block = memoryview(buffers[turn])[: end - pos]
                _read_exactly(fd_src, block, pos, src.name)
                for offset, data in overlays:
                    a, b = max(offset, pos), min(offset + len(data), end)
                    block[a - pos : b - pos] = memoryview(data)[a - offset : b - offset]
                if os.pwrite(fd_dst, block, pos) != end - pos:
                    raise OSError(errno.ENOSPC, "short write")
            if shared and overlays:  # the first patch: the output's hash goes on from the source's so far
                out_h.start_from(src_h)
                shared = False
            jobs = []
            if not shared:
                jobs.append(out_h.hash_bytes(block) if block is not None else out_h.hash_range(pos, end))
            if src_h is not None:  # from the buffer where it holds the source's bytes (the kernel refused)
                same = block is not None and not overlays
                jobs.append(src_h.hash_bytes(block) if same else src_h.hash_range(pos, end))
            if block is not None:
                buffer_jobs[turn], turn = jobs, 1 - turn
            on_bytes(end - pos)
            pos = end
        if pending is not None or next(chunks, None) is not None:
            raise CheckpointError(f"{src.name}: an edited tensor lies past the end of the file; it is truncated")
        if shared:  # no patch at all: the output is the source
            out_h.start_from(src_h)
        src_sha = src_h.hexdigest() if src_h is not None else None
        return src_sha, out_h.hexdigest()


def _read_exactly(fd: int, block: memoryview, pos: int, name: str) -> None:
    """Fill ``block`` from ``fd`` at ``pos``, or raise: the file ended early."""
    done = 0
    while done < len(block):
        n = os.preadv(fd, [block[done:]], pos + done)
        if n == 0:
            raise OSError(errno.EIO, f"{name} ended early while copying it")
        done += n


def _gather(
    chunks: Iterator[Patch], pending: Patch, pos: int, grain: int, size: int, overlays: list[Patch]
) -> tuple[int, Patch | None]:
    """The end of the stretch from ``pos`` that goes through a buffer: the grain the next patch
    lands in, and each following grain that a patch lands in too, up to a buffer's size; the patches
    of the stretch go to ``overlays`` (the last may go on past the end: it is also returned as pending)."""
    end = min(size, pos + grain)
    while True:
        while pending is not None and pending[0] < end:
            if not overlays or overlays[-1] is not pending:
                overlays.append(pending)
            if pending[0] + len(pending[1]) > end:
                break  # it goes on past this grain
            pending = next(chunks, None)
        if pending is None or pending[0] >= end + grain or end + grain - pos > STREAM_BLOCK or end >= size:
            return end, pending
        end = min(size, end + grain)
