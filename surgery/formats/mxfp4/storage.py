"""MXFP4 safetensors checkpoints as transformers stores gpt-oss (``quant_method: "mxfp4"``).

Each fused expert tensor ``X`` (``mlp.experts.gate_up_proj`` / ``down_proj``, [experts, in, out] when in
float) is stored as:

* ``X_blocks`` U8 [experts, out, in/32, 16]: each weight's 4-bit e2m1 code, two a byte along the input
  axis (the even column in the low nibble);
* ``X_scales`` U8 [experts, out, in/32]: one E8M0 scale per 32 input columns of an output row, the
  power of two 2^(s − 127).

A weight's value is its e2m1 value × 2^(s − 127). Decoding is transformers' own
(``convert_moe_packed_tensors``, which gives [experts, in, out], the fused parameter's layout); this
module only reads and decodes (a model held as stored decodes each byte by a table of that decoder's
values: :func:`decode_held`); what an edit may do to such bytes is plan.py's.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core.errors import CheckpointError

BLOCK = 32  # input columns per E8M0 scale
NAN = 255  # E8M0: the scale of byte s is 2^(s − 127); 255 is NaN
TABLE_BYTES = 256 * 256 * 2 * 4  # two float32 values for every (E8M0 scale, byte)


@dataclass(frozen=True)
class Scheme:
    """A gpt-oss MXFP4 checkpoint's weights (the config names only the modules left in bfloat16)."""

    def describe(self) -> str:
        return "MXFP4 (e2m1, E8M0 scale per 32)"


def scheme(qconfig: Any) -> Scheme | None:
    """The MXFP4 scheme a ``quantization_config`` describes, or None."""
    if isinstance(qconfig, Mapping) and qconfig.get("quant_method") == "mxfp4":
        return Scheme()
    return None


@dataclass(frozen=True)
class MxWeight:
    """One MXFP4 fused experts tensor ``name`` (X), logically [experts, in, out], and what holds it."""

    name: str
    shape: tuple[int, int, int]  # [experts, in, out], the fused parameter's layout
    codes: Any  # TensorInfo of X_blocks (U8 [experts, out, in/32, 16])
    scale: Any  # TensorInfo of X_scales (U8 [experts, out, in/32])


def mx_weights(tensors: Mapping[str, Any]) -> dict[str, MxWeight]:
    """Every MXFP4 tensor of a checkpoint by its plain name X, its blocks' and scales' shapes checked."""
    found = {}
    for name in sorted(n for n in tensors if n.endswith("_blocks")):
        base = name.removesuffix("_blocks")
        codes, scale = tensors[name], tensors.get(base + "_scales")
        if codes.dtype != "U8" or len(codes.shape) != 4 or codes.shape[-1] != BLOCK // 2:
            raise CheckpointError(
                f"tensor '{name}' is {codes.dtype} {list(codes.shape)}; MXFP4 blocks are U8 [experts, out, in/32, 16]: "
                "re-download the checkpoint"
            )
        if scale is None or scale.dtype != "U8" or tuple(scale.shape) != tuple(codes.shape[:3]):
            got = "missing" if scale is None else f"{scale.dtype} {list(scale.shape)}"
            raise CheckpointError(
                f"MXFP4 blocks '{name}' need U8 scales '{base}_scales' {list(codes.shape[:3])}, but they are {got}: "
                "the checkpoint is incomplete or corrupt; re-download it"
            )
        experts, out, groups, _ = codes.shape
        found[base] = MxWeight(base, (experts, groups * BLOCK, out), codes, scale)
    return found


def decode_blocks(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 values [n, 32] of ``n`` blocks (bytes [n, 16], E8M0 scales [n]) from anywhere in any experts:
    each byte's two values at its block's scale looked up in :func:`decoder_values` (transformers'
    ``convert_moe_packed_tensors`` of every (scale, byte) pair), the even input's value first as that
    decoder orders them."""
    rows = scales.astype(np.int64)[:, None] * 256 + blocks
    return decoder_values()[rows].reshape(len(scales), BLOCK)


@functools.cache
def decoder_values() -> np.ndarray:
    """:func:`pair_values` as numpy [65536, 2] float32: transformers' decoder's values over its whole input
    domain, so that a lookup is its value bit for bit. Read from surgery's cache where a process with this
    decoder tabulated them (the file named by the decoder's key and its own bytes' sha256, checked as it is
    read), else tabulated now and cached: a bake then decodes without importing torch and transformers
    (~300 MB, and most of its time on a small file)."""
    from ...core.cache import cache_dir, sha256_bytes
    from ...core.staging import atomic_write_bytes

    key = _decoder_key()
    if key is None:  # the decoder's source cannot be read: tabulate it, cache nothing
        return pair_values().numpy().astype("<f4").reshape(256 * 256, 2)
    folder, prefix = cache_dir() / "mxfp4", f"decoder-{key}-"
    for path in sorted(folder.glob(prefix + "*.bin")) if folder.is_dir() else ():
        data = path.read_bytes()
        if len(data) == TABLE_BYTES and path.name == f"{prefix}{sha256_bytes(data)}.bin":
            return np.frombuffer(data, dtype=np.float32).reshape(256 * 256, 2)
    data = pair_values().numpy().astype("<f4").tobytes()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(folder / f"{prefix}{sha256_bytes(data)}.bin", data)
    except OSError:
        pass  # a read-only cache: the table is tabulated again in the next process
    return np.frombuffer(data, dtype=np.float32).reshape(256 * 256, 2)


def _decoder_key() -> str | None:
    """The first 16 hex digits of the sha256 of transformers' MXFP4 decoder's source file and torch's version:
    a patched or reinstalled transformers with the same version string gets a table of its own. Found
    without importing transformers (find_spec of a top-level package does not run it); None where the file
    is not on disk (e.g. a zipped install)."""
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec
    from pathlib import Path

    from ...core.cache import sha256_bytes

    spec = find_spec("transformers")
    if spec is None or spec.origin is None:
        return None
    try:
        source = (Path(spec.origin).parent / "integrations" / "mxfp4.py").read_bytes()
        torch_version = version("torch").encode()
    except (OSError, PackageNotFoundError):
        return None
    return sha256_bytes(source + b"\0" + torch_version)[:16]


@functools.cache
def pair_values():
    """The two values of every byte at every E8M0 scale, [256 · 256, 2] float32 (a torch tensor; row
    ``scale · 256 + byte``, the even column's value first): transformers' ``convert_moe_packed_tensors`` of
    each pair, so that a lookup in it is that decoder's value for value (its e2m1 value times 2^(scale − 127),
    scale 255's included)."""
    import torch
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    every = torch.arange(256, dtype=torch.uint8)
    blocks = every.repeat(256).reshape(1, 256 * 256, 1, 1)  # 65,536 rows of one byte each
    scales = every.repeat_interleave(256).reshape(1, 256 * 256, 1)
    return convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)[0].T.contiguous()


def decode_held(blocks, scales):
    """float32 values [experts, in, out] (the fused parameter's layout) of stored ``blocks`` (uint8 [experts,
    out, in/32, 16]) and their E8M0 ``scales`` (uint8 [experts, out, in/32]; torch tensors, on any device):
    each byte's two values at its block's scale, looked up in :func:`pair_values`. One expert at a time into
    two buffers made once, so the only other memory is the result: fresh temporaries for each expert (the
    index, a wider one, the looked-up values) left the C heap a fifth of the result larger."""
    import torch

    # A row of the table is two float32 values, eight bytes: seen as one int64, a lookup is a 1-D gather
    # (index_select into a buffer: 4× an embedding lookup of the [65,536, 2] table), the same bytes.
    table = pair_values().to(blocks.device).view(torch.int64).view(-1)
    experts, out, groups, half = blocks.shape
    result = torch.empty(experts, groups * half * 2, out, dtype=torch.float32, device=blocks.device)
    first_row = torch.empty(out, groups, 1, dtype=torch.int32, device=blocks.device)
    rows = torch.empty(out, groups, half, dtype=torch.int32, device=blocks.device)
    pairs = torch.empty(out * groups * half, dtype=torch.int64, device=blocks.device)
    for e in range(experts):
        first_row.copy_(scales[e][..., None]).mul_(256)  # each block's first row of the table
        torch.add(first_row, blocks[e], out=rows)
        torch.index_select(table, 0, rows.view(-1), out=pairs)
        result[e].copy_(pairs.view(torch.float32).view(out, groups * half * 2).T)
    return result
