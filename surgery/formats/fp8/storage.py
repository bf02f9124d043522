"""FP8 (e4m3) safetensors checkpoints: which layouts exist, where a weight's scales are, how values decode.

Two families of releases store a linear weight ``X.weight`` as F8_E4M3 [out, in] next to float scales:

* ``quant_method: "fp8"`` with ``weight_block_size: [b0, b1]`` (DeepSeek-V3, Qwen3-FP8):
  ``X.weight_scale_inv`` [ceil(out/b0), ceil(in/b1)], one scale per b0×b1 block;
* ``quant_method: "compressed-tensors"``, format ``float-quantized`` (llm-compressor):
  ``X.weight_scale`` [1] (per tensor), [out, 1] (per output channel) or, with the block strategy,
  [ceil(out/b0), ceil(in/b1)].

In every layout a weight's value is its e4m3 value times its scale, in float32 (the e4m3 codes
themselves: surgery/core/e4m3.py). This module only reads and decodes; what an edit may do to such
bytes is plan.py's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core.e4m3 import decode
from ...core.errors import CheckpointError


@dataclass(frozen=True)
class Scheme:
    """How a checkpoint's config says its FP8 weights are scaled."""

    method: str  # "fp8" or "compressed-tensors"
    suffix: str  # the scale tensor's name after "X."
    block: tuple[int, int] | None  # b0×b1 blocks, or None: per tensor / per channel (by the scale's shape)

    def scale_name(self, weight: str) -> str:
        return weight.removesuffix("weight") + self.suffix


def scheme(qconfig: Any) -> Scheme | None:
    """The FP8 scheme a ``quantization_config`` describes, or None when it is not one surgery edits."""
    if not isinstance(qconfig, Mapping):
        return None
    method = qconfig.get("quant_method")
    if method == "fp8":
        if qconfig.get("fmt", "e4m3") != "e4m3":
            return None
        block = qconfig.get("weight_block_size")
        return Scheme("fp8", "weight_scale_inv", _block(block) if block is not None else None)
    if method == "compressed-tensors" and qconfig.get("format") == "float-quantized":
        blocks = set()
        for group in (qconfig.get("config_groups") or {}).values():
            weights = (group or {}).get("weights") or {}
            if weights.get("type", "float") != "float" or weights.get("num_bits", 8) != 8:
                return None
            if weights.get("strategy") == "block":
                blocks.add(_block(weights.get("block_structure")))
        if len(blocks) > 1:
            return None
        return Scheme("compressed-tensors", "weight_scale", blocks.pop() if blocks else None)
    return None


def _block(value: Any) -> tuple[int, int]:
    if not (isinstance(value, list) and len(value) == 2 and all(type(v) is int and v > 0 for v in value)):
        raise CheckpointError(
            f"quantization_config gives the FP8 block size as {value!r}; it must be two positive integers "
            "[rows, columns]: correct config.json or re-download the checkpoint"
        )
    return value[0], value[1]


@dataclass(frozen=True)
class ScaleLayout:
    """One FP8 weight's scaling: ``kind`` "block", "per-tensor" or "per-channel"; its scale-group size."""

    kind: str
    rows: int  # weight rows per scale row (all of them per tensor)
    cols: int  # weight columns per scale column

    def describe(self) -> str:
        return f"{self.rows}×{self.cols} block" if self.kind == "block" else self.kind


def layout(s: Scheme, weight: str, shape: tuple[int, ...], scale: str, scale_shape: tuple[int, ...]) -> ScaleLayout:
    """The layout of the FP8 weight ``weight`` of ``shape`` whose scale tensor ``scale`` has ``scale_shape``;
    a scale that does not fit the weight is one line naming both."""
    if len(shape) != 2:
        raise CheckpointError(
            f"tensor '{weight}' is FP8 of shape {list(shape)}; surgery edits 2-D FP8 weights [out, in] only"
        )
    out, inp = shape
    if s.block is not None:
        expected = [(math.ceil(out / s.block[0]), math.ceil(inp / s.block[1]))]
    elif s.method == "fp8":
        expected = [(1,)]
    else:
        expected = [(1,), (out, 1)]
    if scale_shape not in expected:
        want = " or ".join(str(list(e)) for e in expected)
        raise CheckpointError(
            f"scale tensor '{scale}' has shape {list(scale_shape)} but FP8 weight '{weight}' {list(shape)} "
            f"needs {want} ({s.method} layout): the scales do not match the weights; re-download the checkpoint"
        )
    if s.block is not None:
        return ScaleLayout("block", *s.block)
    if scale_shape == (out, 1) and out > 1:
        return ScaleLayout("per-channel", 1, inp)
    return ScaleLayout("per-tensor", out, inp)


def expand(scale: np.ndarray, lay: ScaleLayout, first_row: int, n_rows: int, n_cols: int) -> np.ndarray:
    """The float32 scale of every element of rows [first_row, first_row + n_rows) of a weight."""
    grid = scale.reshape(-1, 1) if scale.ndim < 2 else scale
    rows = (np.arange(first_row, first_row + n_rows) // lay.rows).clip(max=grid.shape[0] - 1)
    cols = (np.arange(n_cols) // lay.cols).clip(max=grid.shape[1] - 1)
    return grid[np.ix_(rows, cols)]


def dequantize(raw: np.ndarray, scale: np.ndarray, lay: ScaleLayout, first_row: int) -> np.ndarray:
    """float32 values of a block of e4m3 rows starting at ``first_row``: each element times its scale."""
    return decode(raw) * expand(scale, lay, first_row, *raw.shape)
