"""Integer (int4 / int8) compressed-tensors checkpoints, as llm-compressor writes W4A16 / W8A16.

``quant_method: "compressed-tensors"`` with integer weights stores a linear ``X`` [out, in] as:

* format ``pack-quantized``: ``X.weight_packed`` I32 [out, ⌈in·bits/32⌉], the signed codes plus
  2^(bits-1) packed 32/bits to a word along the input axis; ``X.weight_shape`` [2] the logical shape;
* format ``int-quantized``: ``X.weight`` I8 [out, in], the codes themselves;

next to ``X.weight_scale`` (float) [out, in/group] (strategy group), [out, 1] (channel) or [1]
(tensor) and, when asymmetric, ``X.weight_zero_point`` (packed along the rows for pack-quantized
group / channel, else I8 the shape of the scale). A weight's value is (code − zero point) × its
group's scale. Decoding uses compressed-tensors' own functions (``unpack_from_int32``,
``dequantize``); this module only reads and decodes: what an edit may do to such bytes is
surgery/bake/int_packed.py's.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import CheckpointError

FORMATS = ("pack-quantized", "int-quantized")
STRATEGIES = ("group", "channel", "tensor")
BITS = (4, 8)  # 32 / bits codes fill a word exactly: no code straddles two words
LOGICAL = "PACKED"  # dtype of the [out, in] entry a pack-quantized weight gets in the planner's view
SCALE_DTYPES = ("F32", "BF16", "F16")


@dataclass(frozen=True)
class Scheme:
    """How a checkpoint's config says its integer weights are stored and scaled."""

    format: str  # "pack-quantized" or "int-quantized"
    bits: int
    strategy: str  # "group", "channel" or "tensor"
    group_size: int | None
    symmetric: bool
    args: tuple[tuple[str, Any], ...]  # the config's "weights" entry, for compressed-tensors' QuantizationArgs

    @property
    def packed(self) -> bool:
        return self.format == "pack-quantized"

    @property
    def runs_decompressed(self) -> bool:
        """Whether transformers loads these weights decompressed (by compressed-tensors) on any device, so
        that logits can be compared on a CPU. Measured with transformers 5.24 and compressed-tensors 0.20.1:
        symmetric pack-quantized loads; asymmetric pack-quantized fails on its row-packed zero points'
        shape, and int-quantized stays compressed and fails in the first matmul."""
        return self.packed and self.symmetric

    def describe(self) -> str:
        group = f" {self.group_size}" if self.strategy == "group" else ""
        return f"int{self.bits} {self.format}, {self.strategy}{group}, {'' if self.symmetric else 'a'}symmetric"

    def stored_name(self, weight: str) -> str:
        """The tensor holding the codes of the weight ``X.weight``."""
        return weight + "_packed" if self.packed else weight

    def part(self, weight: str, suffix: str) -> str:
        return weight.removesuffix("weight") + suffix


def scheme(qconfig: Any) -> Scheme | None:
    """The integer scheme a ``quantization_config`` describes, or None when it is not one surgery edits
    (one set of weight arguments for every config group, int4 or int8, group / channel / tensor)."""
    if not isinstance(qconfig, Mapping) or qconfig.get("quant_method") != "compressed-tensors":
        return None
    if qconfig.get("format") not in FORMATS:
        return None
    found = set()
    for group in (qconfig.get("config_groups") or {}).values():
        weights = (group or {}).get("weights") if isinstance(group, Mapping) else None
        if not isinstance(weights, Mapping):
            return None
        found.add(tuple(sorted((k, v) for k, v in weights.items() if not isinstance(v, (list, dict)))))
    if len(found) != 1:
        return None
    args = found.pop()
    w = dict(args)
    strategy, bits, group_size = w.get("strategy"), w.get("num_bits"), w.get("group_size")
    if w.get("type", "int") != "int" or bits not in BITS or strategy not in STRATEGIES or w.get("actorder"):
        return None  # actorder: columns are permuted across groups (weight_g_idx), not contiguous
    if strategy == "group" and not (type(group_size) is int and group_size > 0):
        return None
    return Scheme(qconfig["format"], bits, strategy, group_size, bool(w.get("symmetric", True)), args)


def quantization_args(s: Scheme):
    """compressed-tensors' QuantizationArgs of ``s`` (imported on demand: the ``quant`` extra)."""
    from ..core.optional import require

    return require("compressed_tensors.quantization").QuantizationArgs(**dict(s.args))


@dataclass(frozen=True)
class IntWeight:
    """One integer weight ``name`` [out, in]: the tensors that hold it and its scale-group width."""

    name: str  # X.weight, as the architecture table names it
    shape: tuple[int, int]
    codes: Any  # TensorInfo of X.weight_packed (I32) or X.weight (I8)
    scale: Any  # TensorInfo of X.weight_scale
    zero: Any  # TensorInfo of X.weight_zero_point, or None (symmetric)
    group: int  # input columns per scale column

    @property
    def n_groups(self) -> int:
        return math.ceil(self.shape[1] / self.group)


def _read(folder: Path, info, dtype: type) -> np.ndarray:
    """A whole (small) tensor's elements."""
    with open(folder / info.file, "rb") as f:
        data = os.pread(f.fileno(), info.nbytes, info.start)
    if len(data) != info.nbytes:
        raise CheckpointError(f"{info.file} ended early while reading '{info.name}'; the file is truncated")
    return np.frombuffer(data, dtype=dtype).reshape(info.shape).copy()


def _mismatch(name: str, shape, want, weight: str, wshape, s: Scheme) -> CheckpointError:
    return CheckpointError(
        f"tensor '{name}' has shape {list(shape)} but {s.describe()} weight '{weight}' {list(wshape)} needs "
        f"{want}: the scales do not match the weights; re-download the checkpoint"
    )


def int_weight(s: Scheme, folder: Path, tensors: Mapping[str, Any], weight: str) -> IntWeight:
    """The integer weight ``weight`` (X.weight) of a checkpoint whose tensors are ``tensors``, its
    tensors' shapes and dtypes checked against each other (one line naming the one that does not fit)."""
    codes = tensors[s.stored_name(weight)]
    if s.packed:
        if codes.dtype != "I32" or len(codes.shape) != 2:
            raise CheckpointError(
                f"tensor '{codes.name}' is {codes.dtype} {list(codes.shape)}; pack-quantized "
                "codes are I32 [out, words]: re-download the checkpoint"
            )
        shape_name = s.part(weight, "weight_shape")
        if shape_name not in tensors or tensors[shape_name].dtype not in ("I64", "I32"):
            raise CheckpointError(
                f"pack-quantized weight '{codes.name}' has no I64 '{shape_name}'; the checkpoint "
                "is incomplete: re-download it"
            )
        info = tensors[shape_name]
        shape = tuple(int(v) for v in _read(folder, info, np.int64 if info.dtype == "I64" else np.int32).reshape(-1))
        if len(shape) != 2 or shape[0] != codes.shape[0] or math.ceil(shape[1] * s.bits / 32) != codes.shape[1]:
            raise CheckpointError(
                f"'{shape_name}' says {list(shape)} but '{codes.name}' is {list(codes.shape)} words of {s.bits}-bit "
                "codes: the shapes do not match; re-download the checkpoint"
            )
    else:
        if codes.dtype != "I8" or len(codes.shape) != 2:
            raise CheckpointError(
                f"tensor '{codes.name}' is {codes.dtype} {list(codes.shape)}; int-quantized "
                "codes are I8 [out, in]: re-download the checkpoint"
            )
        shape = codes.shape
    out, inp = shape
    group = s.group_size if s.strategy == "group" else inp
    n_groups = math.ceil(inp / group)
    want_scale = {"group": (out, n_groups), "channel": (out, 1), "tensor": (1,)}[s.strategy]
    scale = tensors.get(s.part(weight, "weight_scale"))
    if scale is None:
        raise CheckpointError(
            f"integer weight '{codes.name}' has no scale tensor '{s.part(weight, 'weight_scale')}' "
            f"({s.describe()}); the checkpoint is incomplete: re-download it"
        )
    if scale.shape != want_scale and not (s.strategy == "tensor" and scale.shape in ((), (1, 1))):
        raise _mismatch(scale.name, scale.shape, list(want_scale), codes.name, shape, s)
    if scale.dtype not in SCALE_DTYPES:
        raise CheckpointError(
            f"scale tensor '{scale.name}' is stored as {scale.dtype}; integer scales are F32, "
            "BF16 or F16: re-download the checkpoint"
        )
    zero = tensors.get(s.part(weight, "weight_zero_point"))
    if not s.symmetric:
        packed_zp = s.packed and s.strategy != "tensor"
        want = (math.ceil(out * s.bits / 32), scale.shape[-1]) if packed_zp else scale.shape
        if zero is None:
            raise CheckpointError(
                f"asymmetric weight '{codes.name}' has no zero points "
                f"'{s.part(weight, 'weight_zero_point')}'; re-download the checkpoint"
            )
        if zero.shape != want or zero.dtype != ("I32" if packed_zp else "I8"):
            raise _mismatch(zero.name, zero.shape, f"{list(want)} {'I32' if packed_zp else 'I8'}", codes.name, shape, s)
    return IntWeight(weight, (out, inp), codes, scale, zero if not s.symmetric else None, group)


def int_weights(s: Scheme, folder: Path, tensors: Mapping[str, Any]) -> dict[str, IntWeight]:
    """Every integer weight of a checkpoint, by its plain name X.weight (shapes checked)."""
    if s.packed:
        names = [n.removesuffix("_packed") for n in tensors if n.endswith(".weight_packed")]
    else:
        names = [n for n, i in tensors.items() if n.endswith(".weight") and i.dtype == "I8"]
    return {n: int_weight(s, folder, tensors, n) for n in sorted(names)}


def _torch_ints(raw: np.ndarray):
    import torch

    return torch.from_numpy(np.ascontiguousarray(raw))


def unpack(s: Scheme, raw: np.ndarray, n_cols: int):
    """Stored codes of a block of rows (I32 words or I8) → int8 codes [rows, n_cols] (a torch tensor)."""
    import torch

    if not s.packed:
        return _torch_ints(raw)
    from ..core.optional import require

    helpers = require("compressed_tensors.compressors.pack_quantized.helpers")
    return helpers.unpack_from_int32(_torch_ints(raw), s.bits, torch.Size([raw.shape[0], n_cols]))


def pack(s: Scheme, codes) -> np.ndarray:
    """int8 codes [rows, cols] (cols filling whole words) → stored elements (I32 words or I8)."""
    if not s.packed:
        return codes.numpy()
    from ..core.optional import require

    helpers = require("compressed_tensors.compressors.pack_quantized.helpers")
    return helpers.pack_to_int32(codes, s.bits).numpy()


def zero_points(s: Scheme, w: IntWeight, raw: np.ndarray | None):
    """The int8 zero points [out, groups] (or [1]) of ``w`` from its stored ``raw`` tensor; None: symmetric."""
    if raw is None:
        return None
    import torch

    if s.packed and s.strategy != "tensor":
        from ..core.optional import require

        helpers = require("compressed_tensors.compressors.pack_quantized.helpers")
        size = torch.Size([w.shape[0], raw.shape[-1]])
        return helpers.unpack_from_int32(_torch_ints(raw), s.bits, size, packed_dim=0)
    return _torch_ints(raw)


def dequantize(s: Scheme, codes, scale: np.ndarray, zero) -> np.ndarray:
    """float32 values of int8 ``codes`` [rows, in] with their rows' float32 ``scale`` and ``zero`` points,
    by compressed-tensors' ``dequantize`` (in float32: (code − zero) × scale is then exact)."""
    import torch

    from ..core.optional import require

    forward = require("compressed_tensors.quantization.lifecycle.forward")
    scale_t = torch.from_numpy(np.ascontiguousarray(scale, dtype=np.float32))
    if s.strategy == "tensor":
        scale_t = scale_t.reshape(1)
    out = forward.dequantize(codes, scale_t, zero, args=quantization_args(s), dtype=torch.float32)
    return out.numpy()
