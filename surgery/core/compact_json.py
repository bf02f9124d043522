"""JSON text that is indented, except that each list of plain numbers is written on one line.

A findings file holds a few hundred such lists (a layer's scores, thousands of numbers each): on
one line each the file stays readable and diffs by layer. The lists go through the json module's C
encoder; only the indented frame around them is assembled here, as ``json.dumps(indent=...)``
lays it out.
"""

from __future__ import annotations

import json
from typing import Any

from .finite_json import finite

# allow_nan=False: a missing number is null (surgery.core.finite_json), never NaN
_compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_scalar = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode
_NUMBERS = {int, float, type(None)}  # by exact type: a bool's JSON is a word, not a number


def dumps(obj: Any, indent: int = 1) -> str:
    """``json.dumps(obj, indent=indent, ensure_ascii=False)`` with every list whose items are all
    ``null``, ints or floats written as ``[1,2.5,null]``: no spaces, no line breaks. A missing
    number (NaN, infinity) is written as ``null`` (surgery.core.finite_json)."""
    parts: list[str] = []
    _write(finite(obj), 0, " " * indent, parts)
    return "".join(parts)


def _key(k: Any) -> str:
    # json turns keys that are not strings into their JSON text: 1 → "1", True → "true", None → "null"
    if not (k is None or isinstance(k, (str, int, float))):
        raise TypeError(f"keys must be str, int, float, bool or None, not {type(k).__name__}")
    return _scalar(k if isinstance(k, str) else _scalar(k))


def _write(obj: Any, level: int, step: str, parts: list[str]) -> None:
    if isinstance(obj, dict):
        if not obj:
            parts.append("{}")
            return
        inner = "\n" + step * (level + 1)
        for i, (k, v) in enumerate(obj.items()):
            parts.append(("{" if i == 0 else ",") + inner + _key(k) + ": ")
            _write(v, level + 1, step, parts)
        parts.append("\n" + step * level + "}")
    elif isinstance(obj, (list, tuple)):
        if set(map(type, obj)) <= _NUMBERS:
            parts.append(_compact(obj))  # also the empty list: "[]"
            return
        inner = "\n" + step * (level + 1)
        for i, v in enumerate(obj):
            parts.append(("[" if i == 0 else ",") + inner)
            _write(v, level + 1, step, parts)
        parts.append("\n" + step * level + "]")
    else:
        parts.append(_scalar(obj))
