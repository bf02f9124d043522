"""MXFP4 (gguf-py's type 39, gpt-oss's experts): 32 values per block, each a 4-bit e2m1 code times one
shared E8M0 exponent byte, 2^(e − 127). α = 2^k adds k to the exponent; E8M0 has no 0, so α = 0 sets
the codes to +0 instead, which also zeroes single values exactly (a pruned neuron's down column)."""

from __future__ import annotations

import numpy as np

from .base import QuantizedBlocks


class MXFP4(QuantizedBlocks):
    """A byte of E8M0 exponent, then 16 bytes of codes: value j < 16 in the low nibble of byte j, value
    j ≥ 16 in the high nibble of byte j − 16 (gguf-py's MXFP4 and llama.cpp's block_mxfp4)."""

    name = "MXFP4"
    requantizable = True
    zeroes_values = True
    exponent = 0  # byte offset of the E8M0 exponent in a block
    codes = 1  # byte offset of the packed codes

    def scaled(self, blocks: np.ndarray, factor: np.ndarray) -> np.ndarray:
        """The exponent shifted by log2 ``factor`` where that is an integer keeping it in 0..254; other
        blocks as they are (the exactness check then refuses them)."""
        out = blocks.copy()
        mantissa, exponent = np.frexp(factor.astype(np.float64))
        shifted = out[:, self.exponent].astype(np.int64) + exponent - 1
        ok = (np.abs(mantissa) == 0.5) & (mantissa > 0) & (shifted >= 0) & (shifted < 255)
        out[ok, self.exponent] = shifted[ok].astype(np.uint8)
        return out

    def zeroed_whole(self, blocks: np.ndarray, scaled: np.ndarray) -> np.ndarray:
        """Every code set to +0: no exponent is 0."""
        return self.zeroed(blocks, np.zeros((len(blocks), self.block_shape[0])))

    def zeroed(self, blocks: np.ndarray, factors: np.ndarray) -> np.ndarray:
        """The code of each value whose factor is 0 set to +0, the other nibble of its byte kept."""
        out = blocks.copy()
        units, cols = np.nonzero(factors == 0)
        half = factors.shape[1] // 2
        at = self.codes + cols % half
        # unbuffered: a byte whose two values are both zeroed is indexed twice
        np.bitwise_and.at(out, (units, at), np.where(cols < half, 0xF0, 0x0F).astype(np.uint8))
        return out
