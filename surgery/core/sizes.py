"""Sizes for people: byte counts as the notes and errors show them, and as options give them."""

from __future__ import annotations

import math
import re

# "70GiB", "500 MB", "8G" (a bare K/M/G/T is binary, as 8G of RAM is 8 GiB), "1.5KiB", "4096"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([KMGT])(i?B)?|B)?\s*$", re.IGNORECASE)
_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4}


def human_size(n: float) -> str:
    """``1536`` → ``"1.5 KiB"``, ``1010`` → ``"1010 B"``: three significant digits, never an exponent."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{_digits(n)} {unit}"
        n /= 1024
    return f"{_digits(n)} TiB"


def _digits(n: float) -> str:
    # .3g writes 1010 as "1.01e+03": from 1000 to 1023 of a unit the whole number is as short
    return f"{n:.0f}" if abs(n) >= 1000 else f"{n:.3g}"


def parse_size(text: str) -> int | None:
    """``"70GiB"``, ``"500MB"``, ``"8G"``, ``"1e9"``, ``"0"`` → bytes; None where ``text`` is no
    size (each option says so in its own words)."""
    match = _SIZE.match(text)
    if match:
        number, prefix, suffix = match.groups()
        if prefix is None:
            return int(float(number))
        base = 1000 if suffix is not None and suffix.lower() == "b" else 1024  # only "GB" is decimal
        return int(float(number) * base ** _POWERS[prefix.lower()])
    try:
        value = float(text)
    except ValueError:
        return None
    # "inf" would overflow int(), "-1" is no size
    return int(value) if math.isfinite(value) and value >= 0 else None
