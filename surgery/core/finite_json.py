"""JSON text with a missing number written as ``null``.

A number that does not exist (the CI of a knockout without interval, a mean over no items) is NaN
in the code. ``json.dumps`` writes it as ``NaN``, which is not JSON: ``jq``, JavaScript and strict
parsers refuse the file. Findings files, surgery.json (and an adapter's), evaluation results and
``--json`` output go through :func:`dumps`, which writes NaN and infinity as ``null``; their
readers take ``null`` (and the ``NaN`` of files written before) as a missing number,
:func:`number` (:func:`missing_as_nan` for a whole tree of numbers) turning it back into NaN where
code computes with it. Tune records and the eval cache are written the same way.
"""

from __future__ import annotations

import json
import math
from numbers import Integral, Real
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float (numpy's too) replaced by None, recursively."""
    if isinstance(value, Real) and not isinstance(value, Integral) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps(obj, **kwargs)`` with missing numbers as ``null`` (:func:`finite`); never ``NaN``."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)


def number(value: float | None) -> float:
    """A number read from surgery's JSON as a float: ``null`` (a missing number) is NaN."""
    return math.nan if value is None else float(value)


def missing_as_nan(value: Any) -> Any:
    """``value`` with every ``null`` turned back into NaN, recursively: for data whose every ``null``
    is a missing number :func:`finite` wrote (measured numbers read back as they were measured)."""
    if value is None:
        return math.nan
    if isinstance(value, dict):
        return {k: missing_as_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [missing_as_nan(v) for v in value]
    return value
