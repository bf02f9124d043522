"""Direction vectors of ``direction`` edits: read from a safetensors file, checked, unit-normalised.

A recipe names a vector as ``FILE.safetensors#NAME`` — a 1-D float tensor in a safetensors file,
the path relative to the recipe — and records the file's sha256 (given in the recipe, it pins the
file: another content is refused). The vector is normalised to unit length in float32 once, here;
every consumer (byte plan, check, twin, LoRA) uses these same float32 values.

A baked folder keeps the unit vectors it used in ``surgery.vectors`` (safetensors content; not
``*.safetensors``, which loaders glob for), under ``<sha256>#<NAME>``, so verify, undo, push and
export-lora read a bake's recipe without the files it was written with.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .checkpoint import file_sha256, file_tensors
from .errors import CheckpointError, RecipeError, not_a_file

VECTORS_NAME = "surgery.vectors"
SHA256 = re.compile(r"[0-9a-f]{64}")
# Stored dtype → how its raw little-endian elements read as numbers (bf16: the top half of a float32).
_DTYPES = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}


def vector_spec(value: Any, where: str) -> str:
    """A recipe value ``FILE.safetensors#NAME``."""
    if not isinstance(value, str) or value.count("#") != 1 or not all(value.split("#")):
        raise RecipeError(
            f"{where} must be FILE.safetensors#NAME (a 1-D tensor NAME in a safetensors file, "
            f"the path relative to the recipe), got {value!r}"
        )
    return value


def sha256_hex(value: Any, where: str) -> str:
    """A recipe value that is a sha256 (64 lowercase hex digits)."""
    if not isinstance(value, str) or not SHA256.fullmatch(value):
        raise RecipeError(f"{where} must be the vector file's sha256 (64 lowercase hex digits), got {value!r}")
    return value


def unit_vector(values: np.ndarray, what: str) -> np.ndarray:
    """``values`` / ‖values‖ in float32 (the norm taken in float64); NaN, inf or zero norm refused."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if not np.isfinite(v).all():
        raise RecipeError(f"{what} holds NaN or inf values; give a finite direction")
    norm = math.sqrt(float(np.dot(v, v)))
    if norm == 0.0:
        raise RecipeError(f"{what} has norm 0 (all zeros): it is no direction; give a non-zero vector")
    return (v.astype(np.float32) / np.float32(norm)).astype(np.float32)


def _read_1d(path: Path, name: str, what: str) -> np.ndarray:
    """Tensor ``name`` of the safetensors file ``path`` as float64 (1-D float only), from its checked header."""
    try:
        tensors = file_tensors(path.parent, path.name)
    except CheckpointError as exc:
        raise RecipeError(f"{what}: {exc}") from None
    info = tensors.get(name)
    if info is None:
        shown = ", ".join(sorted(tensors)[:8]) + (" …" if len(tensors) > 8 else "")
        raise RecipeError(f"{what}: {path.name} has no tensor '{name}' (it has: {shown or 'none'})")
    if info.dtype not in _DTYPES or len(info.shape) != 1:
        raise RecipeError(
            f"{what}: '{name}' is {info.dtype} of shape {list(info.shape)}; a direction is a 1-D "
            f"float tensor ({', '.join(_DTYPES)}) of the model's hidden size"
        )
    with open(path, "rb") as f:
        raw = np.frombuffer(os.pread(f.fileno(), info.nbytes, info.start), dtype=_DTYPES[info.dtype])
    if info.dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return raw.astype(np.float64)


class VectorSource(Protocol):
    """Where a recipe's ``vector`` entries are read from."""

    def unit(self, spec: str, sha256: str | None, where: str) -> tuple[np.ndarray, str]:
        """The float32 unit vector of ``spec`` and the sha256 of the file it came from."""
        ...


class FolderVectors:
    """Vector files relative to a folder (the recipe's)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def unit(self, spec: str, sha256: str | None, where: str) -> tuple[np.ndarray, str]:
        file, name = spec.split("#")
        path = self.folder / file
        if not path.is_file():
            raise RecipeError(f"{where}.vector: {path} {not_a_file(path)}; the path is relative to the recipe's folder")
        digest = file_sha256(path)
        if sha256 is not None and digest != sha256:
            raise RecipeError(
                f"{where}.sha256: {file} has sha256 {digest[:12]}…, the recipe pins {sha256[:12]}…: "
                "the vector file changed since the recipe was written; restore it or drop 'sha256'"
            )
        return unit_vector(_read_1d(path, name, f"{where}.vector"), f"{where}.vector '{spec}'"), digest


class BakedVectors:
    """The unit vectors a bake kept in its folder's ``surgery.vectors``."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / VECTORS_NAME

    def unit(self, spec: str, sha256: str | None, where: str) -> tuple[np.ndarray, str]:
        key = f"{sha256}#{spec.split('#')[1]}"
        if sha256 is None or not self.path.is_file():
            raise RecipeError(
                f"{where}.vector: {self.path.parent} has no {VECTORS_NAME} entry for '{spec}'; "
                "the bake's record is incomplete: bake again"
            )
        # Stored already unit-length in float32: used as is (normalising again could move the last bit).
        return _read_1d(self.path, key, f"{where}.vector").astype(np.float32), sha256
