"""Block types whose every value is proportional to the block's f16 scale fields: the legacy quants
(Q4_0 … Q8_0), the K-quants, the IQ and ternary types.

``scale_fields`` are the fields' byte offsets within one block (llama.cpp's ggml-common.h block
structs; gguf-py's quants.py dequantizers read the same fields); for the types with a min,
y = d·q − dmin·m or y = d·q + m, both fields. Multiplying those fields by α multiplies every value of
the block by α: α = 0 zeroes the block exactly in every type, and any other α is exact when α·d is an
f16 and the dequantizer's float32 arithmetic gives α times its old result (always for a power of two
barring overflow; the shared edit checks every block). A factor on part of a block cannot go through
its scale: only Q8_0 (quant q = 0) zeroes single values exactly; gguf-py requantizes the legacy types.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from .base import QuantizedBlocks


class ScaledBlocks(QuantizedBlocks):
    """Values proportional to the f16 fields at ``scale_fields``: a whole-block factor multiplies them."""

    scale_fields: ClassVar[tuple[int, ...]]

    def scaled(self, blocks: np.ndarray, factor: np.ndarray) -> np.ndarray:
        """Every scale field times its block's ``factor``, rounded to f16."""
        out = blocks.copy()
        with np.errstate(over="ignore", invalid="ignore"):
            for at in self.scale_fields:
                field = out[:, at : at + 2].copy().view(np.float16)[:, 0].astype(np.float32)
                out[:, at : at + 2] = (field * factor).astype(np.float16).reshape(-1, 1).view(np.uint8)
        return out


class KQuantBlocks(ScaledBlocks):
    """A K-quant: sub-blocks with their own small integer scales under the f16 super-block fields."""

    part_reason = "its 6-bit sub-block scales cannot carry α exactly"


class Q4_0(ScaledBlocks):
    name = "Q4_0"
    scale_fields = (0,)
    requantizable = True


class Q4_1(ScaledBlocks):
    name = "Q4_1"
    scale_fields = (0, 2)
    requantizable = True


class Q5_0(ScaledBlocks):
    name = "Q5_0"
    scale_fields = (0,)
    requantizable = True


class Q5_1(ScaledBlocks):
    name = "Q5_1"
    scale_fields = (0, 2)
    requantizable = True


class Q8_0(ScaledBlocks):
    """An f16 scale, then one int8 quant per value: quant 0 is an exact 0 for one value alone."""

    name = "Q8_0"
    scale_fields = (0,)
    requantizable = True
    zeroes_values = True
    quants = 2  # byte offset of value 0's int8 quant

    def zeroed(self, blocks: np.ndarray, factors: np.ndarray) -> np.ndarray:
        out = blocks.copy()
        units, cols = np.nonzero(factors == 0)
        out[units, self.quants + cols] = 0
        return out


class Q2_K(KQuantBlocks):
    name = "Q2_K"
    scale_fields = (80, 82)


class Q3_K(KQuantBlocks):
    name = "Q3_K"
    scale_fields = (108,)


class Q4_K(KQuantBlocks):
    name = "Q4_K"
    scale_fields = (0, 2)


class Q5_K(KQuantBlocks):
    name = "Q5_K"
    scale_fields = (0, 2)


class Q6_K(KQuantBlocks):
    name = "Q6_K"
    scale_fields = (208,)


class IQ2_XXS(ScaledBlocks):
    name = "IQ2_XXS"
    scale_fields = (0,)


class IQ2_XS(ScaledBlocks):
    name = "IQ2_XS"
    scale_fields = (0,)


class IQ2_S(ScaledBlocks):
    name = "IQ2_S"
    scale_fields = (0,)


class IQ3_XXS(ScaledBlocks):
    name = "IQ3_XXS"
    scale_fields = (0,)


class IQ3_S(ScaledBlocks):
    name = "IQ3_S"
    scale_fields = (0,)


class IQ1_S(ScaledBlocks):
    name = "IQ1_S"
    scale_fields = (0,)


class IQ4_NL(ScaledBlocks):
    name = "IQ4_NL"
    scale_fields = (0,)


class IQ4_XS(ScaledBlocks):
    name = "IQ4_XS"
    scale_fields = (0,)


class TQ1_0(ScaledBlocks):
    name = "TQ1_0"
    scale_fields = (52,)


class TQ2_0(ScaledBlocks):
    name = "TQ2_0"
    scale_fields = (64,)
