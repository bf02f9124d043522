"""What each GGUF tensor type lets an edit do to its blocks, exactly, and the edit itself.

A block type stores ``values`` numbers in ``nbytes`` bytes, every one of them proportional to the
block's f16 scale fields (``SCALE_FIELDS``: their byte offsets in the block; for the types with a
min, y = d·q − dmin·m or y = d·q + m, both fields). Multiplying those fields by α multiplies every
value of the block by α: α = 0 zeroes the block exactly in every type, and any other α is exact
when α·d is an f16 and the dequantizer's float32 arithmetic gives α times its old result (always for
a power of two barring overflow; :func:`edit_blocks` checks every block, it does not assume).
MXFP4's blocks share an E8M0 exponent instead: α = 2^k shifts it, α = 0 sets the 4-bit codes to +0.
A factor on part of a block (a single column of a block type) cannot be carried by the block's
scale: only Q8_0 (q = 0) and MXFP4 (code 0) can zero single values exactly; anything else needs ``requantize``,
which gguf-py can do for ``QUANTIZABLE`` types only. F32/F16/BF16 values are edited one by one,
rounded to the stored type as a safetensors bake does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import RecipeError
from ..core.optional import require

FLOATS = ("F32", "F16", "BF16")
# Byte offsets, within one block, of the f16 fields every value of the block is proportional to
# (llama.cpp's ggml-common.h block structs; gguf-py's quants.py dequantizers read the same fields).
SCALE_FIELDS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ2_XXS": (0,),
    "IQ2_XS": (0,),
    "IQ2_S": (0,),
    "IQ3_XXS": (0,),
    "IQ3_S": (0,),
    "IQ1_S": (0,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "TQ1_0": (52,),
    "TQ2_0": (64,),
}
# Types whose values share one E8M0 exponent byte, each value a 4-bit e2m1 code × 2^(e − 127) (gguf-py's
# MXFP4): the byte offset of that exponent. α = 2^k adds k to it; α = 0 zeroes the codes (E8M0 has no 0).
EXPONENT_FIELDS: dict[str, int] = {"MXFP4": 0}
# Types where one value can be zeroed alone, exactly: the byte offset of value 0's int8 quant (q = 0).
ELEMENT_ZERO: dict[str, int] = {"Q8_0": 2}
# Types where one value can be zeroed alone as a 4-bit code (code 0 is +0): the byte offset of the codes,
# value j < half in the low nibble of byte j, value j ≥ half in the high nibble of byte j − half.
NIBBLE_ZERO: dict[str, int] = {"MXFP4": 1}
QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4")  # gguf-py quantizes these (and the floats)
SUPPORTED = FLOATS + tuple(SCALE_FIELDS) + tuple(EXPONENT_FIELDS)


def block_shape(kind: str) -> tuple[int, int]:
    """(values, bytes) of one block of ``kind`` (a float type: one value)."""
    gguf = require("gguf")
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]


def zeroes_values(kind: str) -> bool:
    """Whether ``kind`` can set one value of a block to 0 exactly (a pruned neuron's down column)."""
    return kind in FLOATS or kind in ELEMENT_ZERO or kind in NIBBLE_ZERO


def check_supported(kind: str, tensor: str) -> None:
    """Refuse, in one line, a tensor type whose blocks an edit cannot rewrite."""
    if kind not in SUPPORTED:
        raise RecipeError(
            f"{tensor} is stored as {kind}, which surgery cannot edit in a GGUF (no scale field "
            f"carries an edit); supported types: {', '.join(SUPPORTED)}"
        )


def dequantize(blocks: np.ndarray, kind: str) -> np.ndarray:
    """float32 values (U, values) of ``blocks`` (U, bytes)."""
    gguf = require("gguf")
    return gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[kind]).reshape(len(blocks), -1)


def quantize(values: np.ndarray, kind: str) -> np.ndarray:
    """Blocks (U, bytes) of ``values`` (U, values), quantized as gguf-py does."""
    gguf = require("gguf")
    out = gguf.quants.quantize(np.ascontiguousarray(values, dtype=np.float32), gguf.GGMLQuantizationType[kind])
    return np.ascontiguousarray(out).view(np.uint8).reshape(len(values), -1)


@dataclass
class Edited:
    """New bytes of the edited blocks, and what requantizing some of them cost."""

    blocks: np.ndarray  # (U, bytes) uint8
    requantized: int = 0  # blocks rewritten by quantization rather than exactly
    max_abs_error: float = 0.0  # over the requantized blocks: max |dequantized − edited values|
    rel_rms_error: float = 0.0  # ‖dequantized − edited‖ / ‖edited‖ over them


def _scaled_fields(blocks: np.ndarray, kind: str, factor: np.ndarray) -> np.ndarray:
    """``blocks`` with every scale field multiplied by its unit's ``factor`` (rounded to f16); an E8M0
    exponent shifted by log2 ``factor`` where that is an integer keeping it in 0..254 (else unchanged:
    the exactness check then refuses the block)."""
    out = blocks.copy()
    if kind in EXPONENT_FIELDS:
        at = EXPONENT_FIELDS[kind]
        mantissa, exponent = np.frexp(factor.astype(np.float64))
        shifted = out[:, at].astype(np.int64) + exponent - 1
        ok = (np.abs(mantissa) == 0.5) & (mantissa > 0) & (shifted >= 0) & (shifted < 255)
        out[ok, at] = shifted[ok].astype(np.uint8)
        return out
    with np.errstate(over="ignore", invalid="ignore"):
        for at in SCALE_FIELDS[kind]:
            field = out[:, at : at + 2].copy().view(np.float16)[:, 0].astype(np.float32)
            out[:, at : at + 2] = (field * factor).astype(np.float16).reshape(-1, 1).view(np.uint8)
    return out


def _zeroed_values(blocks: np.ndarray, kind: str, factors: np.ndarray) -> np.ndarray:
    """``blocks`` with each value whose factor is 0 set to quant 0 (``ELEMENT_ZERO`` types) or to the
    4-bit code 0, the other nibble of its byte kept (``NIBBLE_ZERO`` types)."""
    out = blocks.copy()
    units, cols = np.nonzero(factors == 0)
    if kind in NIBBLE_ZERO:
        half = factors.shape[1] // 2
        at = NIBBLE_ZERO[kind] + cols % half
        # unbuffered: a byte whose two values are both zeroed is indexed twice
        np.bitwise_and.at(out, (units, at), np.where(cols < half, 0xF0, 0x0F).astype(np.uint8))
        return out
    out[units, ELEMENT_ZERO[kind] + cols] = 0
    return out


def edit_blocks(blocks: np.ndarray, factors: np.ndarray, kind: str, tensor: str, requantize: bool) -> Edited:
    """New bytes for ``blocks`` (U, bytes) of type ``kind`` whose values are multiplied by ``factors``
    (U, values): exactly, or refused in one line unless ``requantize`` (then the error is measured).

    Every block is checked: gguf-py's dequantizer must give, bit for bit in float32, the old values
    times the factors; a block where it does not is requantized or refused.
    """
    check_supported(kind, tensor)
    old = dequantize(blocks, kind)
    with np.errstate(over="ignore", invalid="ignore"):
        want = old * factors.astype(np.float32)
    if kind in FLOATS:
        if not np.isfinite(want[np.isfinite(old)]).all():
            raise RecipeError(f"{tensor} ({kind}): the scale overflows the stored type; use a smaller factor")
        return Edited(quantize(want, kind))
    uniform = (factors == factors[:, :1]).all(axis=1)
    new = _scaled_fields(blocks, kind, factors[:, 0])
    if kind in NIBBLE_ZERO:  # a block scaled by 0 as a whole: its codes (no exponent is 0)
        whole = uniform & (factors[:, 0] == 0)
        new[whole] = _zeroed_values(blocks[whole], kind, factors[whole])
    if not uniform.all():
        parts = ~uniform
        zero_ones = np.isin(factors[parts], (0.0, 1.0)).all()
        if (kind in ELEMENT_ZERO or kind in NIBBLE_ZERO) and zero_ones:
            new[parts] = _zeroed_values(blocks[parts], kind, factors[parts])
        elif not requantize:
            raise RecipeError(_part_refusal(tensor, kind, factors.shape[1]))
    exact = (dequantize(new, kind) == want).all(axis=1)
    if exact.all():
        return Edited(new)
    if not requantize:
        raise RecipeError(
            f"{tensor} ({kind}): the factor times the blocks' scales is not exact (it must be "
            "an f16 (a power of two for an E8M0 exponent) and leave the dequantizer's float32 result scaled "
            "exactly; a power of two is); use a power of two" + (", or --requantize" if kind in QUANTIZABLE else "")
        )
    if kind not in QUANTIZABLE:
        raise RecipeError(
            f"{tensor} ({kind}): the edit is not exact in {kind} and gguf-py cannot requantize "
            f"{kind} (only {', '.join(QUANTIZABLE)}); use a power-of-two factor on whole blocks"
        )
    redo = ~exact
    new[redo] = quantize(want[redo], kind)
    got = dequantize(new[redo], kind)
    err = got - want[redo]
    norm = float(np.sqrt((want[redo].astype(np.float64) ** 2).sum()))
    return Edited(
        new,
        int(redo.sum()),
        float(np.abs(err).max()),
        float(np.sqrt((err.astype(np.float64) ** 2).sum())) / norm if norm else 0.0,
    )


def _part_refusal(tensor: str, kind: str, values: int) -> str:
    why = (
        "its 6-bit sub-block scales cannot carry α exactly"
        if kind.endswith("_K")
        else "a block has one scale for all its values"
    )
    fix = "add --requantize" if kind in QUANTIZABLE else f"gguf-py cannot requantize {kind}"
    return f"{tensor} ({kind}): the edit scales part of a {values}-value block and {why}; {fix}, or edit whole blocks"
