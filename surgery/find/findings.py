"""Findings files: versioned JSON evidence computed once, cached, and reused for any α or n.

A findings file records what was found (per-head or per-neuron scores) together with the model it
was found on (fingerprint + geometry), the dataset's sha256 and the parameters, so that a later
``amplify-heads`` / ``prune-neurons`` can check it belongs to the model it is applied to.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping

from ..core.architectures import architecture
from ..core.cache import cache_dir
from ..core.checkpoint import Checkpoint
from ..core.errors import FindingsError, SurgeryError
from ..core.staging import atomic_write_text
from ..core.strict_files import DuplicateKey, load_json

FINDINGS_VERSION = 1
KINDS = ("heads", "neurons", "directions")
# The command that writes each kind (messages tell the user to run it).
FINDERS = {"heads": "find-heads", "neurons": "find-neurons", "directions": "find-direction"}


def model_identity(ckpt: Checkpoint) -> dict[str, Any]:
    """What a findings file records about the model it was computed on."""
    arch = architecture(ckpt.config)
    return {
        "fingerprint": ckpt.fingerprint(),
        "model_type": arch.model_type,
        "geometry": arch.geometry.to_dict(),
        "path": str(ckpt.path),
    }


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def params_key(params: Mapping[str, Any]) -> str:
    return sha256_bytes(json.dumps(params, sort_keys=True, default=str).encode())[:16]


def cache_path(kind: str, fingerprint: str, dataset_sha256: str, params: Mapping[str, Any]) -> Path:
    """Where findings for this model + dataset + parameters are cached."""
    return cache_dir() / kind / f"{fingerprint[:16]}-{dataset_sha256[:16]}-{params_key(params)}.json"


def save_findings(findings: Mapping[str, Any], path: Path) -> None:
    """Write findings atomically (an interrupted run leaves the old file or none)."""
    atomic_write_text(Path(path), json.dumps(findings, indent=1, sort_keys=False, default=float) + "\n")


def load_findings(path: str | Path, kind: str) -> dict[str, Any]:
    """Read and check a findings file of the given kind ('heads' or 'neurons')."""
    path, finder = Path(path), FINDERS[kind]
    if not path.is_file():
        raise FindingsError(f"findings file {path} does not exist; give a file written by surgery {finder}")
    try:
        data = load_json(path.read_text(encoding="utf-8"))
    except DuplicateKey as exc:
        raise FindingsError(f"findings file {path}: {exc.what}; surgery writes each key once, so the file "
                            f"was edited: recompute it with surgery {finder}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FindingsError(f"findings file {path} is not valid JSON ({exc.__class__.__name__}); "
                            "recompute it with surgery " + finder) from None
    if not isinstance(data, dict) or data.get("format") != "surgery-findings":
        raise FindingsError(f"{path} is not a surgery findings file (no \"format\": \"surgery-findings\"); "
                            f"give a file written by surgery {finder}")
    if data.get("version") != FINDINGS_VERSION:
        raise FindingsError(f"{path} has findings version {data.get('version')!r}; this surgery reads "
                            f"version {FINDINGS_VERSION}: recompute it with surgery {finder}")
    if data.get("kind") != kind:
        raise FindingsError(f"{path} holds {data.get('kind')!r} findings, but {kind} findings are needed "
                            f"(make them with surgery {finder})")
    if not isinstance(data.get("model"), dict) or "fingerprint" not in data["model"]:
        raise FindingsError(f"{path} does not record the model it was computed on; recompute it")
    return data


def check_model(findings: Mapping[str, Any], ckpt: Checkpoint, allow_transfer: bool = False) -> str | None:
    """Findings must come from this model, or (``allow_transfer``) one of the same architecture.

    Unlike a recipe's base_model, findings record the model's fingerprint, so "this model" means
    the same weights, whatever the path. Returns the note to show (and record) when findings of
    another model are applied under ``allow_transfer``, else None.
    """
    recorded = findings["model"]
    here = model_identity(ckpt)
    if recorded.get("fingerprint") == here["fingerprint"]:
        return None
    same_arch = (recorded.get("model_type") == here["model_type"]
                 and recorded.get("geometry") == here["geometry"])
    if allow_transfer and same_arch:
        return (f"the findings were computed on another model ({recorded.get('path')}) of the same "
                f"architecture; applying them to {ckpt.path} as --transfer asks")
    if same_arch:
        raise FindingsError(
            f"the findings were computed on another model ({recorded.get('path')}) of the same "
            "architecture; pass --transfer to apply them anyway (e.g. instruct → base)")
    raise FindingsError(
        f"the findings were computed on a different model ({recorded.get('path')}, "
        f"{recorded.get('model_type')}) and cannot be applied to {ckpt.path} ({here['model_type']}); "
        f"compute findings for this model with surgery {FINDERS.get(findings.get('kind'), 'find-heads')}")


def new_findings(kind: str, ckpt: Checkpoint, dataset_sha256: str, params: Mapping[str, Any],
                 tool_version: str) -> dict[str, Any]:
    """The common head of every findings file; the finder adds its results."""
    assert kind in KINDS
    return {
        "format": "surgery-findings",
        "version": FINDINGS_VERSION,
        "kind": kind,
        "tool_version": tool_version,
        "model": model_identity(ckpt),
        "dataset_sha256": dataset_sha256,
        "parameters": dict(params),
    }


def dtype_key(load) -> dict[str, str]:
    """What a cache key adds for ``load``'s compute dtype: nothing for float32 (keys as before),
    else the dtype, so bfloat16 findings are cached apart (their sums are float32 either way)."""
    from ..model.loading import compute_dtype
    from ..model.placement import dtype_name

    name = dtype_name(compute_dtype(load))
    return {} if name == "float32" else {"model_dtype": name}


def compute_record(model) -> dict[str, str]:
    """Where and in what precision a finder ran the model (findings record it; sums are float32)."""
    from ..model.placement import dtype_name, input_device

    placed = getattr(model, "hf_device_map", None)
    return {"dtype": dtype_name(model.dtype), "device": str(input_device(model)),
            **({"device_map": "accelerate"} if placed else {})}


@dataclass
class Found:
    """Findings of either kind as the commands use them: the JSON dict, the file it lives in,
    whether it came from the cache, and the note when --transfer applied another model's findings.

    Subclasses (``HeadFindings``, ``NeuronFindings``) set ``kind`` and turn a selection into a
    :class:`~surgery.core.edits.Recipe`. Both are checked against the model they are applied to, from a
    user's file as from the cache.
    """

    data: dict[str, Any]
    path: Path
    from_cache: bool
    transfer_note: str | None = None

    kind: ClassVar[str] = ""

    @classmethod
    def read(cls, path: str | Path, ckpt: Checkpoint, transfer: bool = False) -> "Found":
        """A findings file given by the user, checked against ``ckpt`` (``transfer``: same architecture)."""
        data = load_findings(path, cls.kind)
        note = check_model(data, ckpt, allow_transfer=transfer)
        return cls(data, Path(path), from_cache=True, transfer_note=note)

    @classmethod
    def cached(cls, path: Path, ckpt: Checkpoint) -> "Found | None":
        """The cache entry at ``path`` when it is sound and of this model; None when it is missing,
        damaged or stale (it is then recomputed: a cache entry is never trusted over a fresh run)."""
        if not path.is_file():
            return None
        try:
            found = cls.read(path, ckpt)
            found.check()
        except SurgeryError:
            return None
        return found

    def check(self) -> None:
        """Raise a SurgeryError when the content is not usable (subclasses check their part)."""

    def record(self) -> dict[str, Any]:
        """What a bake records (in surgery.json) about the findings its edits came from."""
        return {"file": str(self.path), "transfer": self.transfer_note is not None}
