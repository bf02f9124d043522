"""A checkpoint placed in a Hub cache as a snapshot, so that MODEL=org/name resolves to it offline."""

from __future__ import annotations

import shutil
from pathlib import Path

SNAPSHOT = "0123456789abcdef0123456789abcdef01234567"  # the commit the snapshot folder is named after


def hub_cache(src: Path, root: Path, repo: str = "org/tiny-llama") -> Path:
    """A copy of ``src`` as the snapshot of ``repo`` at :data:`SNAPSHOT` (also its ``main``) in the
    Hub cache ``root``; returns ``root`` (for HF_HUB_CACHE)."""
    entry = root / f"models--{repo.replace('/', '--')}"
    shutil.copytree(src, entry / "snapshots" / SNAPSHOT)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(SNAPSHOT)
    return root
