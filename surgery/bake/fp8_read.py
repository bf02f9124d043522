"""FP8 (e4m3) weights as a checkpoint stores them: each weight's scale tensor and layout, checked
against its shape, and its exact float32 values (surgery/quant/fp8.py decodes). The FP8 bake
(surgery/bake/fp8.py) and loading for computation (surgery/model/dequantized.py) read them here.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..core.checkpoint import Checkpoint, TensorInfo
from ..core.errors import CheckpointError
from ..quant import fp8
from .patches import CHUNK_BYTES, read_raw, to_f32

SCALE_DTYPES = ("F32", "BF16", "F16")


def scale_of(ckpt: Checkpoint, info: TensorInfo) -> tuple[TensorInfo, fp8.Layout]:
    """The scale tensor of the FP8 weight ``info`` and its layout; one line when it is missing or does not fit."""
    scheme = ckpt.fp8_scheme
    name = scheme.scale_name(info.name)
    if name not in ckpt.tensors:
        raise CheckpointError(
            f"FP8 weight '{info.name}' has no scale tensor '{name}' ({scheme.method} layout); "
            "the checkpoint is incomplete: re-download it"
        )
    scale = ckpt.tensor(name)
    if scale.dtype not in SCALE_DTYPES:
        raise CheckpointError(
            f"scale tensor '{name}' is stored as {scale.dtype}; FP8 scales are F32, BF16 or F16: re-download the checkpoint"
        )
    return scale, fp8.layout(scheme, info.name, info.shape, name, scale.shape)


def read_scale(ckpt: Checkpoint, scale: TensorInfo) -> np.ndarray:
    """A whole scale tensor as float32 (scales are small: one per block or row)."""
    with open(ckpt.path / scale.file, "rb") as f:
        n_rows = scale.shape[0] if scale.shape else 1
        raw = read_raw(f.fileno(), scale, 0, n_rows, scale.shape[-1] if len(scale.shape) >= 2 else 1)
    return to_f32(raw, scale.dtype).reshape(scale.shape)


def dequantized_weight(ckpt: Checkpoint, info: TensorInfo) -> np.ndarray:
    """The float32 values of the FP8 weight ``info`` (e4m3 × its scales, exact), read a chunk of rows at a time."""
    scale_info, lay = scale_of(ckpt, info)
    scale = read_scale(ckpt, scale_info)
    n_rows, n_cols = info.shape
    out = np.empty((n_rows, n_cols), dtype=np.float32)
    with open(ckpt.path / info.file, "rb") as f:
        for start, n in row_steps(n_rows, n_cols):
            out[start : start + n] = fp8.dequantize(read_raw(f.fileno(), info, start, n, n_cols), scale, lay, start)
    return out


def row_steps(n_rows: int, n_cols: int) -> Iterable[tuple[int, int]]:
    """(first row, row count) of chunks of about CHUNK_BYTES in float32, covering ``n_rows`` rows."""
    step = max(1, CHUNK_BYTES // max(1, n_cols * 4))
    for start in range(0, n_rows, step):
        yield start, min(step, n_rows - start)
