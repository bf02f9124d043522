"""Local paths made public: what a published file (surgery.json, its GGUF sidecar, the model card)
says instead of a folder of the machine that baked the checkpoint.

Those folders mean nothing to a reader of the pushed repo, and they may say who ran the bake and
where (a home folder, a temporary folder, the findings cache). A Hub-cache snapshot is named by its
Hub repo, any other path by its last part; the source stays identified by its fingerprint and the
sha256 of its files, the findings by their data's sha256 and parameters.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# A path of the machine that baked the checkpoint: POSIX absolute, home-relative, Windows drive or UNC.
LOCAL_PATH = re.compile(r"^(?:/|~|[A-Za-z]:[\\/]|\\\\)")


def public(text: str) -> str:
    """``text``, or when it is a local path the name a reader can use: the Hub repo of a Hub-cache
    snapshot, else the last part."""
    from ..model.loading import hub_cache_repo

    if not LOCAL_PATH.match(text):
        return text
    path = Path(text.replace("\\", "/"))
    return hub_cache_repo(path) or path.name or text


def public_values(value: Any) -> Any:
    """``value`` with every string made :func:`public`, recursively (keys are left as they are)."""
    if isinstance(value, str):
        return public(value)
    if isinstance(value, Mapping):
        return {k: public_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [public_values(v) for v in value]
    return value
