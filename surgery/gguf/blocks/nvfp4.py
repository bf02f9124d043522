"""NVFP4 (gguf-py's type 40, as llama.cpp's converter writes NVFP4 releases): 64 values per block in four
groups of 16, each value a 4-bit e2m1 code times its group's unsigned e4m3 scale. A factor on a whole
group goes through that scale when the product is an e4m3 value (2 and 0.5 mostly are; the check says);
α = 0 and pruned single values set the codes to +0. gguf-py decodes NVFP4 but cannot encode it, so an
inexact edit is refused, never requantized."""

from __future__ import annotations

import numpy as np

from ...core.errors import RecipeError
from ...core.optional import require
from .base import Edited, GgufBlockType, PartialEdit

GROUPS, GROUP = 4, 16  # a block's groups, and the values of each


class NVFP4(GgufBlockType):
    """Four scale bytes (one unsigned e4m3 per group), then 32 bytes of codes, 8 a group: value j < 8 of
    group g in the low nibble of byte 4 + 8g + j, value j ≥ 8 in the high nibble of byte 4 + 8g + j − 8
    (gguf-py's NVFP4 and llama.cpp's block_nvfp4). Its own ``edit``: the shared one of ``QuantizedBlocks``
    carries a factor per block, and NVFP4's scales are per group of 16."""

    name = "NVFP4"
    zeroes_values = True
    codes = GROUPS  # byte offset of the packed codes; the scales are bytes 0..3

    def zeroed(self, blocks: np.ndarray, factors: np.ndarray) -> np.ndarray:
        """The code of each value whose factor is 0 set to +0, the other nibble of its byte kept."""
        out = blocks.copy()
        units, cols = np.nonzero(factors == 0)
        group, j = cols // GROUP, cols % GROUP
        at = self.codes + 8 * group + j % 8
        # unbuffered: a byte whose two values are both zeroed is indexed twice
        np.bitwise_and.at(out, (units, at), np.where(j < 8, 0xF0, 0x0F).astype(np.uint8))
        return out

    def edit(
        self, blocks: np.ndarray, factors: np.ndarray, tensor: str, requantize: bool, part: PartialEdit = PartialEdit()
    ) -> Edited:
        """Factors uniform on each group of 16 go through its scale (0 through its codes); single values
        can only be zeroed; every block is then checked against gguf-py's decoder, bit for bit."""
        old = self.dequantize(blocks)
        with np.errstate(over="ignore", invalid="ignore"):
            want = old * factors.astype(np.float32)
        groups = factors.reshape(len(factors), GROUPS, GROUP)
        uniform = (groups == groups[:, :, :1]).all(axis=2)  # (U, GROUPS)
        if not (uniform | np.isin(groups, (0.0, 1.0)).all(axis=2)).all():
            raise RecipeError(
                f"{tensor} ({self.name}): {part.what} scales part of a group of {GROUP} values, which share one "
                f"e4m3 scale, and gguf-py cannot requantize NVFP4: {part.options(None)}"
            )
        factor = np.where(uniform, groups[:, :, 0], 1.0)
        new = self._group_scaled(blocks, np.where(factor == 0, 1.0, factor))
        zero = np.where(uniform[:, :, None] & (groups[:, :, :1] != 0), 1.0, groups).reshape(factors.shape)
        if (zero == 0).any():
            new = self.zeroed(new, zero)
        if (self.dequantize(new) == want).all():
            return Edited(new)
        raise RecipeError(
            f"{tensor} ({self.name}): the factor times a group's e4m3 scale is not an e4m3 value, so the "
            "edit cannot be exact, and gguf-py cannot requantize NVFP4; use a factor whose products stay "
            "e4m3 values (a power of two away from the format's limits), or prune"
        )

    @staticmethod
    def _group_scaled(blocks: np.ndarray, factor: np.ndarray) -> np.ndarray:
        """``blocks`` with the scale of group g of unit u times ``factor[u, g]``, rounded as ggml encodes."""
        codec = require("gguf").quants.NVFP4
        out = blocks.copy()
        change = factor != 1.0
        if change.any():
            raw = 2 * codec.ue4m3_to_fp32(out[:, :GROUPS])  # the decoder halves the e4m3 value
            with np.errstate(over="ignore", invalid="ignore"):
                new = codec.fp32_to_ue4m3((raw * factor).astype(np.float32))
            out[:, :GROUPS] = np.where(change, new, out[:, :GROUPS])
        return out
