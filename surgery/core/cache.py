"""Where surgery keeps what it computes once and reuses: findings, file hashes, evaluation results."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$SURGERY_CACHE``, else ``$XDG_CACHE_HOME/surgery``, else ``~/.cache/surgery``."""
    if os.environ.get("SURGERY_CACHE"):
        return Path(os.environ["SURGERY_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "surgery"
