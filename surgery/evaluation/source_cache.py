"""The source's evaluation, cached: ``surgery eval MODEL --against SOURCE`` measures SOURCE once.

An entry is two files in ``<cache dir>/eval/`` named by :func:`surgery.core.cache.cache_path`:
a JSON (the source's metrics and details, and the sha256 of the other file) and a safetensors
file with the source's next-token log-probabilities on the KL prompts (float32, every position
and the whole vocabulary: KL and top-1 agreement need the full distributions; SmolLM2's 24
prompts take 45 MB). The key holds everything the numbers depend on: the source's fingerprint
and model key (tokenizer files, chat template), its weight files' sizes and modification times,
the data measured, the suites, the compute dtype and device type, and the surgery version with a
hash of the measuring code. Batch size is
not in it: batching never changes a number beyond float rounding.

A missing number (a mean over no items, NaN) is ``null`` in the JSON (surgery.core.finite_json) and
NaN again when read, as an entry written before (``NaN`` in the file) reads: the measured numbers
never hold ``null`` otherwise, so the run read back is the run measured.

A damaged, stale or mismatched entry is never trusted: it is recomputed (and rewritten). The
folder keeps its most recently used entries up to ``MAX_CACHE_BYTES`` (:func:`prune`, after each
write): a reading marks an entry used.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from ..core import distributed
from ..core.cache import cache_path
from ..core.checkpoint import Checkpoint, file_sha256
from ..core.finite_json import dumps, finite, missing_as_nan
from ..core.staging import atomic_write_bytes, atomic_write_text
from ..core.strict_files import load_json
from ..model.loading import LoadSpec, compute_dtype
from ..model.placement import dtype_name, resolve_device
from .lm import kl_prompt_shard

FORMAT = "surgery-eval-source"
VERSION = 1
# lm-eval's tasks bring their own data and code (outside the plan): a source evaluated with them is not cached
UNCACHED_SUITES = ("lm-eval",)
# the modules whose code makes the numbers: a change to any of them is a new cache key
MEASURING_CODE = ("lm.py", "suites.py", "bbq.py", "awareness.py", "markers.py")
# The folder's size limit: ~45 entries for SmolLM2's 45 MB, ~17 at a 128k vocabulary (118 MB).
MAX_CACHE_BYTES = 2 << 30
# A tensors file with no JSON is a write in progress (the JSON comes last) for this long, then litter.
ORPHAN_SECONDS = 3600


@dataclass
class SourceRun:
    """The source's metrics and details, and its KL reference (this rank's prompts; None without KL)."""

    metrics: dict[str, Any]
    details: dict[str, Any]
    reference: list[torch.Tensor] | None
    from_cache: bool


def cacheable(suites: tuple[str, ...]) -> bool:
    return not any(s in UNCACHED_SUITES for s in suites)


def _code_sha256() -> str:
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in MEASURING_CODE:
        h.update((here / name).read_bytes())
    return h.hexdigest()


def _weights_stat(ckpt: Checkpoint) -> list[tuple[str, int, int]]:
    """Name, size and mtime of each weight file: the fingerprint samples blocks, so an edit in place
    that misses them still changes the key."""
    return [(f, (s := (ckpt.path / f).stat()).st_size, s.st_mtime_ns) for f in ckpt.weight_files]


def entry_paths(
    ckpt: Checkpoint, fingerprint: str, data: Any, suites: tuple[str, ...], limit: int | None, load: LoadSpec
) -> tuple[Path, Path, dict[str, Any]]:
    """The entry's JSON and safetensors paths, and its key (recorded in the JSON and checked on reading)."""
    from .. import __version__

    data_sha = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
    key = {
        "fingerprint": fingerprint,
        "model_key": ckpt.model_key(),  # the tokenizer and chat template decide what is measured too
        "weights": _weights_stat(ckpt),
        "data_sha256": data_sha,
        "suites": list(suites),
        "limit": limit,
        "dtype": dtype_name(compute_dtype(load)),
        "device": torch.device(resolve_device(load.device)).type,
        "device_map": load.device_map,
        "tool_version": __version__,
        "code_sha256": _code_sha256(),
    }
    params = {k: v for k, v in key.items() if k not in ("fingerprint", "data_sha256")}
    path = cache_path("eval", fingerprint, data_sha, params)
    return path, path.with_suffix(".safetensors"), key


def read(json_path: Path, tensors_path: Path, key: dict[str, Any], n_prompts: int) -> SourceRun | None:
    """The cached run when the entry is whole and of this key; None otherwise (missing, damaged,
    stale). Of the KL reference only this rank's prompts are read."""
    if not json_path.is_file():
        return None
    try:
        entry = load_json(json_path.read_text(encoding="utf-8"))  # a repeated key: a miss
        if (
            not isinstance(entry, dict)
            or entry.get("format") != FORMAT
            or entry.get("version") != VERSION
            or entry.get("key") != load_json(json.dumps(key))
        ):
            return None
        reference = None
        if entry["kl_prompts"] is not None:
            if entry["kl_prompts"] != n_prompts or file_sha256(tensors_path) != entry["tensors_sha256"]:
                return None
            with safe_open(str(tensors_path), framework="pt") as f:
                reference = [f.get_tensor(f"prompt.{i}") for i in kl_prompt_shard(n_prompts)]
        metrics, details = entry["metrics"], entry["details"]
        if not isinstance(metrics, dict) or not isinstance(details, dict) or entry["sha256"] != _content_sha256(entry):
            return None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, SafetensorError):
        return None
    try:
        os.utime(json_path)  # used now: prune() drops the least recently used entries first
    except OSError:
        pass  # a read-only cache still serves
    return SourceRun(missing_as_nan(metrics), missing_as_nan(details), reference, from_cache=True)


def write(json_path: Path, tensors_path: Path, key: dict[str, Any], run: SourceRun, n_prompts: int) -> None:
    """Write the entry (rank 0 only; under torchrun ``run.reference`` must hold every prompt).

    The tensors go first and the JSON records their sha256: a half-written entry never reads back."""
    entry: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "key": key,
        "kl_prompts": None,
        # null for a missing number: the content hash below is over what the file holds
        "metrics": finite(run.metrics),
        "details": finite(run.details),
    }
    if run.reference is not None:
        from safetensors.torch import save

        assert len(run.reference) == n_prompts
        atomic_write_bytes(tensors_path, save({f"prompt.{i}": t.contiguous() for i, t in enumerate(run.reference)}))
        entry["kl_prompts"], entry["tensors_sha256"] = n_prompts, file_sha256(tensors_path)
    entry["sha256"] = _content_sha256(entry)
    atomic_write_text(json_path, dumps(entry, indent=1) + "\n")
    prune(json_path.parent, keep=json_path)


def prune(folder: Path, keep: Path, limit: int = MAX_CACHE_BYTES) -> list[Path]:
    """Delete the least recently used entries of ``folder`` (JSON + tensors) until it holds at most
    ``limit`` bytes, never ``keep`` (the entry just written); also tensors files whose JSON never came.
    Returns the deleted JSON paths. Another process deleting the same files at once is harmless."""
    entries, now = [], time.time()
    for tensors in folder.glob("*.safetensors"):
        try:
            if not tensors.with_suffix(".json").exists() and now - tensors.stat().st_mtime > ORPHAN_SECONDS:
                tensors.unlink()
        except OSError:
            pass
    for json_path in folder.glob("*.json"):
        try:
            tensors, st = json_path.with_suffix(".safetensors"), json_path.stat()
            entries.append((st.st_mtime, json_path, st.st_size + (tensors.stat().st_size if tensors.exists() else 0)))
        except OSError:
            continue  # deleted meanwhile
    total, dropped = sum(size for _, _, size in entries), []
    for _, json_path, size in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        if json_path == keep:
            continue
        for path in (json_path, json_path.with_suffix(".safetensors")):  # the JSON first: no half entry reads back
            path.unlink(missing_ok=True)
        total -= size
        dropped.append(json_path)
    return dropped


def _content_sha256(entry: dict[str, Any]) -> str:
    """sha256 of the numbers (a changed or damaged entry that still parses is not trusted either)."""
    return hashlib.sha256(
        json.dumps([entry["metrics"], entry["details"], entry.get("tensors_sha256")], sort_keys=True).encode()
    ).hexdigest()


def gather_reference(mine: list[torch.Tensor], n_prompts: int) -> list[torch.Tensor]:
    """Every prompt's log-probabilities on every rank, from each rank's shard (one process: as is)."""
    if not distributed.under_torchrun():
        return mine
    import numpy as np

    indices = kl_prompt_shard(n_prompts)
    lengths = distributed.gather_rows(n_prompts, indices, np.array([len(t) for t in mine], dtype=np.int64))
    starts = np.concatenate([[0], np.cumsum(lengths)])
    rows = [r for i in indices for r in range(int(starts[i]), int(starts[i + 1]))]
    vocab = mine[0].shape[-1] if mine else 0
    vocab = int(distributed.all_reduce(np.array([vocab]), "max")[0])
    flat = torch.cat(mine).numpy() if mine else np.zeros((0, vocab), dtype=np.float32)
    every = torch.from_numpy(distributed.gather_rows(int(starts[-1]), rows, flat))
    return [every[int(starts[i]) : int(starts[i + 1])] for i in range(n_prompts)]
