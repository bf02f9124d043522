"""Where surgery keeps what it computes once and reuses: findings, file hashes, evaluation results."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """``$SURGERY_CACHE``, else ``$XDG_CACHE_HOME/surgery``, else ``~/.cache/surgery``."""
    if os.environ.get("SURGERY_CACHE"):
        return Path(os.environ["SURGERY_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "surgery"


def sha256_bytes(data: bytes) -> str:
    """The hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def params_key(params: Mapping[str, Any]) -> str:
    """A short key of ``params`` (their JSON, keys sorted)."""
    return sha256_bytes(json.dumps(params, sort_keys=True, default=str).encode())[:16]


def cache_path(kind: str, model_key: str, dataset_sha256: str, params: Mapping[str, Any]) -> Path:
    """Where the findings (or evaluation results) of this model + dataset + parameters are cached;
    ``model_key`` is the model's :meth:`~surgery.core.checkpoint.Checkpoint.model_key` (weights,
    tokenizer, chat template), the dataset's sha256 is of its content, ``params`` every option that
    changes the result."""
    return cache_dir() / kind / f"{model_key[:16]}-{dataset_sha256[:16]}-{params_key(params)}.json"
