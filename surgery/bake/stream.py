"""Stream a file to a new one with some byte ranges replaced, hashing both sides in the same pass: the
primitive under every bake that edits bytes in place (safetensors shards, GGUF files) and under GGUF verify."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from ..core.errors import CheckpointError
from ..core.kernel_copy import kernel_copy

STREAM_BLOCK = 16 << 20  # a patched file is streamed through memory this much at a time


def stream_patched(
    src: Path,
    dst: Path,
    new_bytes: Callable[[int], Iterator[tuple[int, memoryview]]],
    hash_source: bool = True,
    on_bytes: Callable[[int], None] = lambda n: None,
    stop: threading.Event | None = None,
) -> tuple[str | None, str]:
    """Write ``src`` to ``dst`` with ``new_bytes(fd_src)``'s (offset, bytes) overlaid (in file order,
    disjoint), in one streaming pass; return the sha256 of the source (when ``hash_source``) and of
    the output. A set ``stop`` (another shard failed) ends the pass early with an error.

    Each source block is read once: it is hashed as the source, overlaid with the patches' new
    bytes, hashed as the output and written, the two hashes on two threads (hashlib releases the
    GIL), so no byte of the file is read back for hashing. A block no patch lands in is written by
    the kernel (``copy_file_range``, page cache to page cache, as ``cp`` does) while the threads hash
    the bytes just read, instead of passing through Python a second time. Memory: four 16 MB buffers.
    """
    size = os.stat(src).st_size
    src_h, out_h = hashlib.sha256(), hashlib.sha256()
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
        pending = next(chunks, None)
        # Two buffers each, used in turn: one is filled while the threads still hash the other.
        # Reused buffers spare the page faults of a fresh 16 MB allocation per block.
        reads = [bytearray(STREAM_BLOCK) for _ in range(2)]
        writes: list[bytearray] = []
        with ThreadPoolExecutor(max_workers=2) as pool:
            jobs: list = []
            pos, turn = 0, 0
            use_kernel = True  # until the kernel refuses to copy between these files
            while pos < size:
                if stop is not None and stop.is_set():
                    raise CheckpointError(f"{src.name}: stopped, another shard failed")
                raw = memoryview(reads[turn])[: min(STREAM_BLOCK, size - pos)]
                n = os.preadv(fd_src, [raw], pos)
                if n == 0:
                    raise OSError(errno.EIO, f"{src.name} ended early while copying it")
                raw = raw[:n]
                for job in jobs:  # the other buffers are free again
                    job.result()
                end = pos + n
                block = raw
                while pending is not None and pending[0] < end:
                    offset, data = pending
                    if block is raw:  # copied only where a patch lands
                        writes = writes or [bytearray(STREAM_BLOCK) for _ in range(2)]
                        block = memoryview(writes[turn])[:n]
                        block[:] = raw
                    a, b = max(offset, pos), min(offset + len(data), end)
                    block[a - pos : b - pos] = memoryview(data)[a - offset : b - offset]
                    if offset + len(data) > end:
                        break  # the rest of this chunk lands in the next block
                    pending = next(chunks, None)
                jobs = [pool.submit(out_h.update, block)] + ([pool.submit(src_h.update, raw)] if hash_source else [])
                if block is raw and use_kernel:
                    use_kernel = kernel_copy(fd_src, fd_dst, pos, pos, n)
                if block is not raw or not use_kernel:
                    if os.pwrite(fd_dst, block, pos) != n:
                        raise OSError(errno.ENOSPC, "short write")
                on_bytes(n)
                pos, turn = end, 1 - turn
            for job in jobs:
                job.result()
        if pending is not None or next(chunks, None) is not None:
            raise CheckpointError(f"{src.name}: an edited tensor lies past the end of the file; it is truncated")
    return src_h.hexdigest() if hash_source else None, out_h.hexdigest()
