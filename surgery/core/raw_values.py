"""Stored tensor elements as raw numpy values, and exactly to float32 and back.

The storage dtypes the byte plans read and write (core/patches.py, the formats' plans, the bake's
check): floats kept as their bits where numpy has no type (bfloat16), FP8 e4m3 through core/e4m3.py,
integer codes never converted, only replaced.
"""

from __future__ import annotations

import os

import numpy as np

from . import e4m3
from .checkpoint import TensorInfo
from .errors import CheckpointError, RecipeError

# Storage dtype → numpy dtype of the raw elements (bf16 has no numpy type: we keep its bits).
RAW_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,
    e4m3.DTYPE: np.uint8,
    "I32": np.int32,
    "I8": np.int8,
    "U8": np.uint8,
}
# The float dtypes every format edits; a format adds its own (StoredFormat.edited_dtypes).
FLOAT_DTYPES = ("F32", "F16", "BF16")
# Integer codes (int4 / int8, packed e2m1): never scaled, only replaced (surgery/formats/int_packed/, nvfp4/).
INT_DTYPES = ("I32", "I8", "U8")


def to_f32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Raw stored elements → float32 (exact for every supported dtype)."""
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    if dtype == e4m3.DTYPE:
        return e4m3.decode(raw)
    return raw.astype(np.float32)


def from_f32(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 → raw stored elements, rounding once to nearest-even (as torch does for bf16)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if dtype == "BF16":
        bits = values.view(np.uint32)
        rounded = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)
        nan = np.isnan(values)
        rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)  # keep NaN a (quiet) NaN
        return rounded
    if dtype in INT_DTYPES:
        raise RecipeError(
            "integer codes would be scaled as floats; this edit should have been refused. Please report this bug"
        )
    if dtype == e4m3.DTYPE:  # never rounded: the FP8 plan (surgery/formats/fp8/plan.py) admits exact scales only
        raw, exact = e4m3.encode_exact(values)
        if not exact.all():
            raise RecipeError(
                "an FP8 weight would be rounded; this edit should have been refused. Please report this bug"
            )
        return raw
    return values.astype(RAW_DTYPES[dtype])


def read_raw(fd: int, info: TensorInfo, first_row: int, n_rows: int, n_cols: int) -> np.ndarray:
    """Rows [first_row, first_row + n_rows) of a stored tensor, as raw elements."""
    itemsize = np.dtype(RAW_DTYPES[info.dtype]).itemsize
    offset = info.start + first_row * n_cols * itemsize
    if first_row + n_rows > (int(np.prod(info.shape[:-1])) if len(info.shape) >= 2 else info.shape[0]):
        raise CheckpointError(f"rows {first_row}..{first_row + n_rows} are outside '{info.name}'")
    size = n_rows * n_cols * itemsize
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise CheckpointError(f"{info.file} ended early while reading '{info.name}'; the file is truncated")
    return np.frombuffer(data, dtype=RAW_DTYPES[info.dtype]).reshape(n_rows, n_cols).copy()
