"""A count with its noun in the right number (``1 file``, ``3 files``) for what users read."""

from __future__ import annotations


def in_number(n: int, noun: str, plural: str | None = None) -> str:
    """The noun alone in the number of ``n`` (``unknown key x``, ``unknown keys x, y``): ``noun`` for
    one, else ``plural`` (default: ``noun`` + s)."""
    return noun if n == 1 else plural or noun + "s"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``"1 file"``, ``"2 files"``: ``noun`` for one, else ``plural`` (default: ``noun`` + s)."""
    return f"{n} {in_number(n, noun, plural)}"
