"""One sha256 fed in file order on its own thread, a bounded number of jobs behind the caller: the
hashes of :func:`surgery.bake.stream.stream_patched`."""

from __future__ import annotations

import errno
import hashlib
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..core.checkpoint import HASH_SLICE


class FileHasher:
    """A sha256 on one worker thread, so its jobs run in the order given: byte ranges of the file
    ``fd`` (read in slices of ``HASH_SLICE``, or ``most`` when smaller, into one reused buffer) or buffers
    the caller filled. At most
    ``lag`` jobs wait: the caller blocks rather than run further ahead (the ranges it copied are still
    in the page cache when they are hashed, and progress stays honest)."""

    def __init__(self, fd: int, name: str, lag: int, most: int = HASH_SLICE) -> None:
        self._fd, self._name, self._lag = fd, name, lag
        self._sha = hashlib.sha256()
        self._pool = ThreadPoolExecutor(max_workers=1)
        self._jobs: deque[Future] = deque()
        self._slice = bytearray(min(HASH_SLICE, most))  # only the worker thread reads into it

    def __enter__(self) -> FileHasher:
        return self

    def __exit__(self, kind: Any, *rest: Any) -> None:
        # On an error the queued jobs are dropped; the running one ends before the files are closed.
        self._pool.shutdown(wait=True, cancel_futures=kind is not None)

    def _submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        while len(self._jobs) >= self._lag:
            self._jobs.popleft().result()
        job = self._pool.submit(fn, *args)
        self._jobs.append(job)
        return job

    def hash_range(self, start: int, end: int) -> Future:
        """Hash the file's bytes [start, end) after the jobs before."""
        return self._submit(self._read_range, start, end)

    def hash_bytes(self, data: memoryview) -> Future:
        """Hash ``data`` after the jobs before; the caller keeps it unchanged until the job is done."""
        return self._submit(lambda: self._sha.update(data))

    def start_from(self, other: FileHasher) -> None:
        """Go on from ``other``'s state once its jobs given so far are done (this hash's own jobs so far
        are dropped from it): two hashes of bytes that are the same up to here."""
        state = other._submit(lambda: other._sha.copy())
        self._submit(lambda: setattr(self, "_sha", state.result()))

    def hexdigest(self) -> str:
        """The digest once every job is done (a job's error is raised here)."""
        while self._jobs:
            self._jobs.popleft().result()
        return self._sha.hexdigest()

    def _read_range(self, start: int, end: int) -> None:
        view = memoryview(self._slice)
        pos = start
        while pos < end:
            n = os.preadv(self._fd, [view[: min(len(view), end - pos)]], pos)
            if n == 0:
                raise OSError(errno.EIO, f"{self._name} ended early while copying it")
            self._sha.update(view[:n])
            pos += n
