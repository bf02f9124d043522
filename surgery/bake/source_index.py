"""Where a bake's source is on this machine.

surgery.json is published with the checkpoint, so it names its source publicly (the folder's name
or its Hub repo, surgery.bake.public) with the weights' fingerprint. The folder (or GGUF file) a bake
read is remembered here instead, in the cache, keyed by that fingerprint and never published, so
that ``surgery push`` can still check a bake against its source while it is on this machine.
"""

from __future__ import annotations

from pathlib import Path

from ..core.cache import cache_dir
from ..core.staging import atomic_write_text
from ..model.loading import Source

FOLDER = "sources"


def _entry(fingerprint: str) -> Path:
    return cache_dir() / FOLDER / f"{fingerprint[:32]}.txt"


def remember_source(source: Source) -> None:
    """Remember where ``source`` (with its fingerprint) is on this machine; a read-only cache is no error."""
    if source.fingerprint is None:
        return
    try:
        atomic_write_text(_entry(source.fingerprint), str(source.path.resolve()) + "\n")
    except OSError:
        pass  # push then checks every recorded sha256 instead of comparing with the source


def local_source_path(source: Source) -> Path | None:
    """The folder or file on this machine that a bake recorded as ``source``: the path a bake of 0.1
    recorded, else the one remembered for its fingerprint; None when unknown or gone. Callers
    compare it with the bake (a changed source fails that comparison, as it did before)."""
    if source.path.is_absolute():
        path = source.path
    elif source.fingerprint is not None:
        try:
            path = Path(_entry(source.fingerprint).read_text(encoding="utf-8").strip())
        except (OSError, UnicodeDecodeError):
            return None
    else:
        return None
    return path if path.exists() else None
