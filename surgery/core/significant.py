"""Round float64 arrays to n significant digits, value for value what ``float(f"{x:.{n}g}")`` gives.

Findings files keep their scores to 6 significant digits; Python's formatting rounds one number at a
time (SmolLM2's findings hold 875 000 of them: about a third of a second). Here the same doubles come
from whole-array operations, and the few numbers where they could differ go through Python's
formatting itself:

* ``x · 10^k`` (``k`` chosen so the result has n digits before the point) is one IEEE multiply or
  divide by an exact power of ten (``|k| ≤ 22``), so it is within half an ulp of the exact product:
  rounding it to an integer (``np.rint``, half to even) gives the digits Python's correctly rounded
  formatting gives, unless the product lies within that error of a half-integer;
* the digits ``d`` (an integer below 2^53) over ``10^k`` is again one correctly rounded operation on
  two exact numbers: the double nearest the decimal ``d·10^-k``, which is what ``float()`` of the
  formatted text parses to (Clinger's fast path).

Numbers near a tie (``|frac − ½|`` below a bound 8× the product's worst error), outside
``|k| ≤ 22`` (below ~1e-17 or above ~1e22), zeros, infinities and NaN keep Python's (NaN stays NaN).
"""

from __future__ import annotations

import numpy as np

# 10^0 .. 10^22: every one is an exact double (10^22 < 2^53 · 2^22 with an odd part 5^22 < 2^53).
_POW10 = np.array([float(f"1e{i}") for i in range(23)])
MAX_DIGITS = 15  # the digits d stay below 2^53 and 10^-digits above the product's error


def significant(x: np.ndarray, digits: int) -> np.ndarray:
    """``x`` (any shape) with every value rounded to ``digits`` significant digits, equal bit for bit
    to ``float(f"{v:.{digits}g}")`` of each value (NaN stays NaN)."""
    if not 1 <= digits <= MAX_DIGITS:
        raise ValueError(f"digits must be between 1 and {MAX_DIGITS}, got {digits}")
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()
    flat, done = out.reshape(-1), np.zeros(x.size, dtype=bool)
    a = np.abs(x.reshape(-1))
    idx = np.flatnonzero(np.isfinite(a) & (a > 0))
    done[np.flatnonzero(~(np.isfinite(a) & (a > 0)))] = True  # 0, ±0, ±inf, NaN: Python's answer is the value
    v = a[idx]
    with np.errstate(divide="ignore"):
        k = (digits - 1) - np.floor(np.log10(v)).astype(np.int64)
    for _ in range(2):  # log10 may be off by one next to a power of ten: then the product has one digit too many or few
        scaled = _scale(v, k)
        k = np.where(scaled < _POW10[digits - 1], k + 1, np.where(scaled >= _POW10[digits], k - 1, k))
    fast = np.abs(k) <= 22
    scaled = _scale(v, k)
    # the product's error is at most half an ulp of a number below 10^digits
    near_tie = np.abs(scaled - np.floor(scaled) - 0.5) <= _POW10[digits] * 2.0**-50
    fast &= ~near_tie & (scaled >= _POW10[digits - 1]) & (scaled < _POW10[digits])
    d = np.rint(scaled[fast])
    kf = k[fast]
    exact = np.where(kf >= 0, d / _POW10[np.clip(kf, 0, 22)], d * _POW10[np.clip(-kf, 0, 22)])
    flat[idx[fast]] = np.copysign(exact, flat[idx[fast]])
    done[idx[fast]] = True
    for i in np.flatnonzero(~done):  # near a tie or out of range: Python's formatting itself
        flat[i] = float(f"{flat[i]:.{digits}g}")
    return out


def _scale(v: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``v · 10^k`` in one IEEE operation (a multiply or a divide by an exact power of ten); ``k``
    outside ±22 gives a value the caller leaves to Python."""
    up = _POW10[np.clip(k, 0, 22)]
    down = _POW10[np.clip(-k, 0, 22)]
    return np.where(k >= 0, v * up, v / down)
