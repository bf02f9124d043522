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
plan.py's.

GPTQ's activation ordering (the weights' ``actorder``): ``weight`` only changed the order in which
llm-compressor quantized the columns, the layout is the plain one; ``group`` assigns the input columns
to scale groups in activation order and stores ``X.weight_g_idx`` I32 [in], the group of each column
(codes stay in column order). compressed-tensors up to 0.18 decoded it by sorting the columns by
group, dequantizing, and sorting back; 0.20 removed it, so this module does that sort around the
installed library's ``dequantize``.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...core.errors import CheckpointError

FORMATS = ("pack-quantized", "int-quantized")
STRATEGIES = ("group", "channel", "tensor")
BITS = (4, 8)  # 32 / bits codes fill a word exactly: no code straddles two words
SCALE_DTYPES = ("F32", "BF16", "F16")
# The weights' actorder as configs spell it (compressed-tensors' aliases; ``true`` meant "group") → its layout
ACTORDERS = {"weight": "weight", "static": "weight", "group": "group", "dynamic": "group"}


@dataclass(frozen=True)
class Scheme:
    """How a checkpoint's config says its integer weights are stored and scaled."""

    format: str  # "pack-quantized" or "int-quantized"
    bits: int
    strategy: str  # "group", "channel" or "tensor"
    group_size: int | None
    symmetric: bool
    args: tuple[tuple[str, Any], ...]  # the config's "weights" entry, for compressed-tensors' QuantizationArgs
    actorder: str | None = None  # "weight" or "group" (GPTQ's activation ordering), see the module docstring

    @property
    def packed(self) -> bool:
        return self.format == "pack-quantized"

    @property
    def permuted(self) -> bool:
        """Whether each weight's input columns are assigned to scale groups by its ``X.weight_g_idx``
        (compressed-tensors registers it for group strategy only)."""
        return self.actorder == "group" and self.strategy == "group"

    @property
    def not_run(self) -> str | None:
        """Why transformers cannot run these weights decompressed (by compressed-tensors), on a CPU at
        least, or None when it can; surgery then dequantizes them itself as it loads, on any device
        (hold.py). Measured with transformers 5.24 and compressed-tensors 0.20.1."""
        if self.actorder == "group":
            return (
                "compressed-tensors 0.20 removed GPTQ's actorder 'group' (it refuses the config), so transformers "
                "cannot load it"
            )
        if not self.packed:
            return "transformers keeps int-quantized weights compressed and fails in their first matmul on a CPU"
        if not self.symmetric:
            return "transformers fails on the shape of asymmetric pack-quantized weights' row-packed zero points"
        return None

    def describe(self) -> str:
        group = f" {self.group_size}" if self.strategy == "group" else ""
        order = f", actorder {self.actorder}" if self.actorder else ""
        return f"int{self.bits} {self.format}, {self.strategy}{group}, {'' if self.symmetric else 'a'}symmetric{order}"

    def stored_name(self, weight: str) -> str:
        """The tensor holding the codes of the weight ``X.weight``."""
        return weight + "_packed" if self.packed else weight

    def part(self, weight: str, suffix: str) -> str:
        return weight.removesuffix("weight") + suffix

    # The storage: compressed-tensors' own here; AutoAWQ's (surgery/formats/awq/storage.py) stores the same layout otherwise.
    transposed = False  # whether the stored codes' and scales' rows are the weight's input columns

    def weights(self, folder: Path, tensors: Mapping[str, Any]) -> dict[str, IntWeight]:
        """Every integer weight of a checkpoint, by its plain name X.weight (shapes checked)."""
        return int_weights(self, folder, tensors)

    def compressed(self, codes: np.ndarray, scale: np.ndarray, zero: np.ndarray | None):
        """(codes, float32 scales, stored zero points) of one weight as compressed-tensors stores them."""
        return codes, scale, zero

    def packed_codes(self, codes, n_cols: int) -> np.ndarray:
        """int8 codes [out, cols] of a weight of ``n_cols`` input columns (cols filling whole words) → its stored codes."""
        return pack(self, codes)


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
    if w.get("type", "int") != "int" or bits not in BITS or strategy not in STRATEGIES:
        return None
    order = "group" if w.get("actorder") is True else w.get("actorder")
    if order not in (None, False, *ACTORDERS):  # an ordering compressed-tensors never wrote
        return None
    if strategy == "group" and not (type(group_size) is int and group_size > 0):
        return None
    symmetric = bool(w.get("symmetric", True))
    return Scheme(qconfig["format"], bits, strategy, group_size, symmetric, args, ACTORDERS.get(order))


def quantization_args(s: Scheme):
    """compressed-tensors' QuantizationArgs of ``s`` (imported on demand: the ``quant`` extra), without its
    actorder: that only steered calibration or the column order, which ``dequantize`` here applies itself
    (and compressed-tensors 0.20 refuses "group")."""
    from ...core.optional import require

    args = {k: v for k, v in s.args if k != "actorder"}
    return require("compressed_tensors.quantization").QuantizationArgs(**args)


@dataclass(frozen=True)
class IntWeight:
    """One integer weight ``name`` [out, in]: the tensors that hold it and its scale-group width."""

    name: str  # X.weight, as the architecture table names it
    shape: tuple[int, int]
    codes: Any  # TensorInfo of X.weight_packed (I32) or X.weight (I8)
    scale: Any  # TensorInfo of X.weight_scale
    zero: Any  # TensorInfo of X.weight_zero_point, or None (symmetric)
    group: int  # input columns per scale column
    g_idx: np.ndarray | None = field(default=None, compare=False)  # each column's group (actorder group)

    @property
    def n_groups(self) -> int:
        return math.ceil(self.shape[1] / self.group)

    def group_of(self) -> np.ndarray:
        """The scale group (column of the scales) of each input column."""
        return self.g_idx if self.g_idx is not None else np.arange(self.shape[1]) // self.group

    def members(self) -> list[np.ndarray]:
        """The input columns of each scale group."""
        of = self.group_of()
        return [np.flatnonzero(of == g) for g in range(self.n_groups)]


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
    g_idx = _group_index(s, folder, tensors, weight, codes.name, inp, group)
    return IntWeight(weight, (out, inp), codes, scale, zero if not s.symmetric else None, group, g_idx)


def _group_index(s: Scheme, folder: Path, tensors: Mapping[str, Any], weight: str, codes: str, inp: int, group: int):
    """The group of each of the ``inp`` input columns that ``X.weight_g_idx`` stores (actorder group), checked:
    a permutation of the contiguous groups, as GPTQ writes it and compressed-tensors decoded it; None when
    the columns are grouped in order."""
    name = s.part(weight, "weight_g_idx")
    info = tensors.get(name)
    if not s.permuted:
        if info is not None:
            raise CheckpointError(
                f"tensor '{name}' assigns the columns of '{codes}' to scale groups, but the config says "
                f"{s.describe()} (no actorder 'group'): the config does not describe these weights; re-download the checkpoint"
            )
        return None
    if info is None:
        raise CheckpointError(
            f"weight '{codes}' ({s.describe()}) has no '{name}', the scale group of each input column: "
            "the checkpoint is incomplete; re-download it"
        )
    if info.dtype not in ("I32", "I64") or info.shape != (inp,):
        raise CheckpointError(
            f"tensor '{name}' is {info.dtype} {list(info.shape)} but '{codes}' has {inp} input columns: it must be "
            f"I32 [{inp}], one scale group per column; re-download the checkpoint"
        )
    g_idx = _read(folder, info, np.int64 if info.dtype == "I64" else np.int32).astype(np.int64)
    n_groups = math.ceil(inp / group)
    if g_idx.min() < 0 or g_idx.max() >= n_groups:
        bad = int(g_idx.min() if g_idx.min() < 0 else g_idx.max())
        raise CheckpointError(
            f"tensor '{name}' names scale group {bad} but '{codes}' has {n_groups} (0..{n_groups - 1}): "
            "the checkpoint is corrupt; re-download it"
        )
    if not np.array_equal(np.bincount(g_idx, minlength=n_groups), np.bincount(np.arange(inp) // group)):
        raise CheckpointError(
            f"tensor '{name}' gives a scale group of '{codes}' other than {group} columns (group_size): "
            "compressed-tensors decodes whole groups only; the checkpoint is corrupt, re-download it"
        )
    return g_idx


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
    from ...core.optional import require

    helpers = require("compressed_tensors.compressors.pack_quantized.helpers")
    return helpers.unpack_from_int32(_torch_ints(raw), s.bits, torch.Size([raw.shape[0], n_cols]))


@functools.cache
def byte_codes(bits: int):
    """The codes each byte of packed I32 words holds, in order, [256, 8 // bits] float32 (a torch tensor):
    compressed-tensors' unpacking of a word made of that byte four times, so that a lookup of a weight's
    bytes (little-endian words, as safetensors stores them) in it is that unpacking, code for code."""
    import torch

    from ...core.optional import require

    helpers = require("compressed_tensors.compressors.pack_quantized.helpers")
    words = (np.arange(256, dtype=np.uint32) * 0x01010101).view(np.int32).reshape(256, 1)
    codes = helpers.unpack_from_int32(torch.from_numpy(words), bits, torch.Size([256, 32 // bits]))
    return codes[:, : 8 // bits].to(torch.float32)


def pack(s: Scheme, codes) -> np.ndarray:
    """int8 codes [rows, cols] (cols filling whole words) → stored elements (I32 words or I8)."""
    if not s.packed:
        return codes.numpy()
    from ...core.optional import require

    helpers = require("compressed_tensors.compressors.pack_quantized.helpers")
    return helpers.pack_to_int32(codes, s.bits).numpy()


def zero_points(s: Scheme, w: IntWeight, raw: np.ndarray | None):
    """The int8 zero points [out, groups] (or [1]) of ``w`` from its stored ``raw`` tensor; None: symmetric."""
    if raw is None:
        return None
    import torch

    if s.packed and s.strategy != "tensor":
        from ...core.optional import require

        helpers = require("compressed_tensors.compressors.pack_quantized.helpers")
        size = torch.Size([w.shape[0], raw.shape[-1]])
        return helpers.unpack_from_int32(_torch_ints(raw), s.bits, size, packed_dim=0)
    return _torch_ints(raw)


def dequantize(s: Scheme, codes, scale: np.ndarray, zero, g_idx: np.ndarray | None = None) -> np.ndarray:
    """float32 values of int8 ``codes`` [rows, in] with their rows' float32 ``scale`` and ``zero`` points,
    by compressed-tensors' ``dequantize`` (in float32: (code − zero) × scale is then exact). ``g_idx``:
    each column's group (actorder group); the columns are sorted by it, decoded as contiguous groups and
    put back, as compressed-tensors did while it supported it."""
    import torch

    from ...core.optional import require

    forward = require("compressed_tensors.quantization.lifecycle.forward")
    scale_t = torch.from_numpy(np.ascontiguousarray(scale, dtype=np.float32))
    if s.strategy == "tensor":
        scale_t = scale_t.reshape(1)
    order = None if g_idx is None else torch.from_numpy(np.argsort(g_idx, kind="stable"))
    grouped = codes if order is None else codes[:, order]
    out = forward.dequantize(grouped, scale_t, zero, args=quantization_args(s), dtype=torch.float32).numpy()
    if order is None:
        return out
    values = np.empty_like(out)
    values[:, order.numpy()] = out
    return values
