"""Float tensor types (F32, F16, BF16): every value is its own number, so any edit is computed in float32
and rounded once to the stored type, as a safetensors bake does; a single value zeroes exactly."""

from __future__ import annotations

import numpy as np

from ...core.errors import RecipeError
from .base import Edited, GgufBlockType, PartialEdit


class FloatValues(GgufBlockType):
    """Values stored as floats, one per "block": edited value by value (never requantized, only rounded)."""

    zeroes_values = True

    def edit(
        self, blocks: np.ndarray, factors: np.ndarray, tensor: str, requantize: bool, part: PartialEdit = PartialEdit()
    ) -> Edited:
        old = self.dequantize(blocks)
        with np.errstate(over="ignore", invalid="ignore"):
            want = old * factors.astype(np.float32)
        if not np.isfinite(want[np.isfinite(old)]).all():
            raise RecipeError(f"{tensor} ({self.name}): the scale overflows the stored type; use a smaller factor")
        return Edited(self.quantize(want))


class F32(FloatValues):
    name = "F32"


class F16(FloatValues):
    name = "F16"


class BF16(FloatValues):
    name = "BF16"
