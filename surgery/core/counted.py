"""A count with its noun in the right number (``1 file``, ``3 files``) for what users read."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``"1 file"``, ``"2 files"``: ``noun`` for one, else ``plural`` (default: ``noun`` + s)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
