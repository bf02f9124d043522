"""The safetensors dtype F8_E4M3 (e4m3fn): its 256 codes as float32, exactly, both ways.

A storage dtype like BF16, so the byte plan (bake/patches.py) reads and writes it as it does the
others; what an FP8 checkpoint's scales mean is its format's (surgery/formats/fp8/).
"""

from __future__ import annotations

import numpy as np

DTYPE = "F8_E4M3"
MAX = 448.0  # e4m3fn's largest finite value; it has no inf, 0x7F / 0xFF are NaN


def _table() -> np.ndarray:
    """The float32 value of each of the 256 e4m3fn codes (sign, 4 exponent bits of bias 7, 3 mantissa bits)."""
    codes = np.arange(256)
    exp, man = (codes >> 3) & 0xF, codes & 0x7
    values = np.where(exp == 0, man / 8 * 2.0**-6, (1 + man / 8) * 2.0 ** (exp - 7))
    values = np.where(codes & 0x80, -values, values)
    values[(codes & 0x7F) == 0x7F] = np.nan
    return values.astype(np.float32)


VALUES = _table()
POSITIVE = VALUES[:0x7F]  # codes 0x00..0x7E: increasing from +0 to 448


def decode(raw: np.ndarray) -> np.ndarray:
    """Raw e4m3 bytes → float32 (exact)."""
    return VALUES[raw]


def encode_exact(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 → (e4m3 bytes, mask of the values e4m3 holds exactly); inexact ones get an arbitrary byte."""
    values = np.asarray(values, dtype=np.float32)
    magnitude = np.abs(values)
    idx = np.minimum(np.searchsorted(POSITIVE, magnitude), len(POSITIVE) - 1)
    exact = POSITIVE[idx] == magnitude
    raw = (idx | (np.signbit(values).astype(np.int64) << 7)).astype(np.uint8)
    return raw, exact
