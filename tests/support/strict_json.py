"""JSON read as strict parsers (jq, JavaScript) read it: ``NaN`` and ``Infinity`` are not JSON."""

from __future__ import annotations

import json
from typing import Any


def strict(text: str) -> Any:
    """``json.loads`` as jq reads: NaN and Infinity raise ValueError."""

    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)
