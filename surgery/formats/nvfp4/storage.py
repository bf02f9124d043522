"""NVFP4 compressed-tensors checkpoints (``nvfp4-pack-quantized``), as llm-compressor writes them.

``quant_method: "compressed-tensors"``, format ``nvfp4-pack-quantized``, weights ``type: float``,
``num_bits: 4``, ``strategy: tensor_group``, ``group_size: 16``, symmetric, stores a linear ``X``
[out, in] as:

* ``X.weight_packed`` U8 [out, in/2]: each weight's 4-bit e2m1 code, two to a byte along the input
  axis (sign bit and a magnitude index into 0, 0.5, 1, 1.5, 2, 3, 4, 6);
* ``X.weight_scale`` F8_E4M3 [out, in/16]: one scale per 16 input columns of a row;
* ``X.weight_global_scale`` F32 [1].

A weight's value is its e2m1 value × (its group's scale / the global scale), in float32. Decoding
uses compressed-tensors' own functions (``unpack_fp4_from_uint8``, ``dequantize``) and packing its
``pack_fp4_to_uint8``; this module only reads, decodes and packs: what an edit may do to such bytes
is plan.py's.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core import e4m3
from ...core.errors import CheckpointError
from ...core.optional import require

FORMAT = "nvfp4-pack-quantized"
GROUP = 16  # input columns per e4m3 scale: NVFP4's block
# The weights' arguments an NVFP4 config gives (llm-compressor's NVFP4 and NVFP4A16 presets)
ARGS = {"type": "float", "num_bits": 4, "strategy": "tensor_group", "group_size": GROUP, "symmetric": True}


@dataclass(frozen=True)
class Scheme:
    """An NVFP4 checkpoint's weights; ``args``: the config's "weights" entry, for compressed-tensors."""

    args: tuple[tuple[str, Any], ...]

    def describe(self) -> str:
        return "NVFP4 (e2m1, e4m3 scale per 16, global scale)"

    def part(self, weight: str, suffix: str) -> str:
        return weight.removesuffix("weight") + suffix


def scheme(qconfig: Any) -> Scheme | None:
    """The NVFP4 scheme a ``quantization_config`` describes, or None when it is not one surgery edits."""
    if not isinstance(qconfig, Mapping) or qconfig.get("quant_method") != "compressed-tensors":
        return None
    if qconfig.get("format") != FORMAT:
        return None
    found = set()
    for group in (qconfig.get("config_groups") or {}).values():
        weights = (group or {}).get("weights") if isinstance(group, Mapping) else None
        if not isinstance(weights, Mapping) or any(weights.get(k, v) != v for k, v in ARGS.items()):
            return None
        found.add(tuple(sorted((k, v) for k, v in weights.items() if not isinstance(v, (list, dict)))))
    return Scheme(found.pop()) if len(found) == 1 else None


def refusal(qconfig: Any) -> str | None:
    """Why an ``nvfp4-pack-quantized`` config is one surgery does not edit (its weights' arguments), or None."""
    if not isinstance(qconfig, Mapping) or qconfig.get("format") != FORMAT or scheme(qconfig) is not None:
        return None
    return (
        "NVFP4 weights in a variant surgery cannot edit exactly (it edits symmetric e2m1 codes in groups of 16 "
        f"with e4m3 scales and a global scale: {ARGS}); bake into the unquantized checkpoint"
    )


def quantization_args(s: Scheme):
    """compressed-tensors' QuantizationArgs of ``s`` (imported on demand: the ``quant`` extra)."""
    return require("compressed_tensors.quantization").QuantizationArgs(**dict(s.args))


@dataclass(frozen=True)
class Fp4Weight:
    """One NVFP4 weight ``name`` [out, in] and the tensors that hold it."""

    name: str  # X.weight, as the architecture table names it
    shape: tuple[int, int]
    codes: Any  # TensorInfo of X.weight_packed (U8 [out, in/2])
    scale: Any  # TensorInfo of X.weight_scale (F8_E4M3 [out, in/16])
    global_scale: Any  # TensorInfo of X.weight_global_scale (F32 [1])


def _wrong(name: str, info, want: str, weight: str) -> CheckpointError:
    return CheckpointError(
        f"tensor '{name}' is {info.dtype} {list(info.shape)} but NVFP4 weight '{weight}' needs {want}: "
        "the checkpoint does not match its config; re-download it"
    )


def fp4_weight(s: Scheme, tensors: Mapping[str, Any], weight: str) -> Fp4Weight:
    """The NVFP4 weight ``weight`` (X.weight), its tensors' shapes and dtypes checked against each other."""
    codes = tensors[weight + "_packed"]
    if codes.dtype != "U8" or len(codes.shape) != 2:
        raise _wrong(codes.name, codes, "U8 [out, in/2] (two e2m1 codes a byte)", weight)
    out, inp = codes.shape[0], codes.shape[1] * 2
    if inp % GROUP:
        raise _wrong(codes.name, codes, f"a multiple of {GROUP} input columns", weight)
    parts = {"weight_scale": (e4m3.DTYPE, (out, inp // GROUP)), "weight_global_scale": ("F32", (1,))}
    found = {}
    for suffix, (dtype, shape) in parts.items():
        name = s.part(weight, suffix)
        info = tensors.get(name)
        if info is None:
            raise CheckpointError(
                f"NVFP4 weight '{codes.name}' has no '{name}'; the checkpoint is incomplete: re-download it"
            )
        if info.dtype != dtype or tuple(info.shape) != shape:
            raise _wrong(name, info, f"{dtype} {list(shape)}", weight)
        found[suffix] = info
    return Fp4Weight(weight, (out, inp), codes, found["weight_scale"], found["weight_global_scale"])


def fp4_weights(s: Scheme, tensors: Mapping[str, Any]) -> dict[str, Fp4Weight]:
    """Every NVFP4 weight of a checkpoint, by its plain name X.weight (shapes checked)."""
    names = sorted(n.removesuffix("_packed") for n in tensors if n.endswith(".weight_packed"))
    return {n: fp4_weight(s, tensors, n) for n in names}


def unpack(raw: np.ndarray):
    """Stored bytes [rows, in/2] → their e2m1 values [rows, in] as float32 (a torch tensor), by compressed-tensors."""
    import torch

    helpers = require("compressed_tensors.compressors.nvfp4.helpers")
    packed = torch.from_numpy(np.ascontiguousarray(raw))
    return helpers.unpack_fp4_from_uint8(packed, raw.shape[0], raw.shape[1] * 2, dtype=torch.float32)


@functools.cache
def byte_values():
    """The two e2m1 values of every byte, [256, 2] float32 (a torch tensor): compressed-tensors' unpacking of
    each of the 256 bytes, so that a lookup in it is that unpacking, value for value."""
    return unpack(np.arange(256, dtype=np.uint8).reshape(1, 256)).reshape(256, 2)


def decode_held(codes, scale, global_scale):
    """float32 weights [rows, in] of stored bytes ``codes`` (uint8 [rows, in/2]) with their stored e4m3
    ``scale`` [rows, in/16] and F32 ``global_scale`` [1] (torch tensors, on any device): each byte's two e2m1
    values (:func:`byte_values`) times their group's :func:`group_scales`, the product compressed-tensors'
    float32 ``dequantize`` computes."""
    import torch

    table = byte_values().to(codes.device)
    # an embedding lookup is the table's rows gathered, value for value: 4× faster here than indexing
    values = torch.nn.functional.embedding(codes.to(torch.int32), table).reshape(codes.shape[0], -1)
    groups = scale.to(torch.float32) / global_scale.to(torch.float32).reshape(1)
    values.view(codes.shape[0], groups.shape[1], GROUP).mul_(groups[:, :, None])
    return values


def pack(values) -> np.ndarray:
    """e2m1 values [rows, in] (a float32 torch tensor) → stored bytes, by compressed-tensors."""
    return require("compressed_tensors.compressors.nvfp4.helpers").pack_fp4_to_uint8(values).numpy()


def group_scales(scale: np.ndarray, global_scale: np.ndarray):
    """The float32 scale of each group, [rows, in/16]: its e4m3 scale / the global scale, as
    compressed-tensors' ``dequantize`` divides them (a torch tensor)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(scale, dtype=np.float32)) / torch.from_numpy(
        np.ascontiguousarray(global_scale, dtype=np.float32).reshape(1)
    )


def dequantize(s: Scheme, values, scale: np.ndarray, global_scale: np.ndarray) -> np.ndarray:
    """float32 weights of e2m1 ``values`` [rows, in] (from :func:`unpack`) with their rows' float32 e4m3
    ``scale`` and the ``global_scale``, by compressed-tensors' ``dequantize``."""
    import torch

    forward = require("compressed_tensors.quantization.lifecycle.forward")
    return forward.dequantize(
        values,
        torch.from_numpy(np.ascontiguousarray(scale, dtype=np.float32)),
        args=quantization_args(s),
        global_scale=torch.from_numpy(np.ascontiguousarray(global_scale, dtype=np.float32).reshape(1)),
        dtype=torch.float32,
    ).numpy()
