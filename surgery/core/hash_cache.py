"""sha256 of source files, remembered by what the file system says about each file.

A bake hashes every byte at most once; across bakes of the same source (an α sweep, prune then
amplify) the source's shards would otherwise be hashed again every time. Like git's index, an entry
is keyed by the file's identity and state — device, inode, size, modification and change times in
nanoseconds — so any write to the file (which moves its change time; no user call can set that
back) misses the cache. As in git, an entry is only stored once the file has been still for
``SETTLE_SECONDS`` before the hash began: a write in the same clock tick as the hash would
otherwise leave the same key on different bytes. ``surgery verify`` never uses this cache.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .cache import cache_dir
from .staging import atomic_write_text
from .strict_files import load_json

CACHE_NAME = "sha256-by-stat.json"
SETTLE_SECONDS = 2.0
MAX_ENTRIES = 20_000  # the oldest are dropped beyond this: a few MB of JSON at most


def _key(path: Path) -> tuple[str, os.stat_result]:
    st = os.stat(path)
    return (f"{os.path.realpath(path)}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"), st


class HashCache:
    """sha256 of files by stat key, read once and written back atomically by :meth:`save`."""

    def __init__(self, root: Path | None = None):
        self.path = (root or cache_dir()) / CACHE_NAME
        self.started = time.time()
        self.entries = self._read()
        self.added: dict[str, str] = {}

    def _read(self) -> dict[str, str]:
        try:
            data = load_json(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}  # none yet, or unreadable: hashes are recomputed, never trusted half-read
        return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}

    def get(self, path: Path) -> str | None:
        """The remembered sha256 of ``path`` in its current state, or None."""
        return self.entries.get(_key(path)[0])

    def put(self, path: Path, digest: str) -> None:
        """Remember ``digest`` for ``path`` if the file was unchanged for a while before the hash."""
        key, st = _key(path)
        if max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 <= self.started - SETTLE_SECONDS:
            self.added[key] = digest

    def save(self) -> None:
        """Merge what this run added into the file (another run may have written it meanwhile)."""
        if not self.added:
            return
        entries = {**self._read(), **self.added}
        entries = dict(list(entries.items())[-MAX_ENTRIES:])
        try:
            atomic_write_text(self.path, json.dumps(entries, indent=0) + "\n")  # makes the folder too
        except OSError:
            pass  # a read-only or full cache folder costs the next bake its hashing, nothing else
