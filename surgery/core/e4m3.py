"""The safetensors dtype F8_E4M3 (e4m3fn): its 256 codes as float32, exactly, both ways.

A storage dtype like BF16, so the byte plan (core/patches.py) reads and writes it as it does the
others; what an FP8 checkpoint's scales mean is its format's (surgery/formats/fp8/).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

DTYPE = "F8_E4M3"
MAX = 448.0  # e4m3fn's largest finite value; it has no inf, 0x7F / 0xFF are NaN


@cache
def values() -> np.ndarray:
    """The float32 value of each of the 256 e4m3fn codes (sign, 4 exponent bits of bias 7, 3 mantissa bits),
    built on first use: registering the formats (``import surgery``) imports no numpy."""
    import numpy as np

    codes = np.arange(256)
    exp, man = (codes >> 3) & 0xF, codes & 0x7
    table = np.where(exp == 0, man / 8 * 2.0**-6, (1 + man / 8) * 2.0 ** (exp - 7))
    table = np.where(codes & 0x80, -table, table)
    table[(codes & 0x7F) == 0x7F] = np.nan
    return table.astype(np.float32)


def decode(raw: np.ndarray) -> np.ndarray:
    """Raw e4m3 bytes → float32 (exact)."""
    import numpy as np

    return np.take(values(), raw)  # the table looked up: 5× indexing it with a uint8 array


def encode_exact(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 → (e4m3 bytes, mask of the values e4m3 holds exactly); inexact ones get an arbitrary byte."""
    import numpy as np

    x = np.asarray(x, dtype=np.float32)
    positive = values()[:0x7F]  # codes 0x00..0x7E: increasing from +0 to 448
    magnitude = np.abs(x)
    idx = np.minimum(np.searchsorted(positive, magnitude), len(positive) - 1)
    exact = positive[idx] == magnitude
    raw = (idx | (np.signbit(x).astype(np.int64) << 7)).astype(np.uint8)
    return raw, exact
