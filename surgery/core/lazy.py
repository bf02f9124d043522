"""A package's public names imported on first use (PEP 562), so that importing the package stays cheap."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, exports: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: ``exports`` maps each name to the module that defines
    it (absolute, or relative to ``package`` when it starts with "."); a name once imported is kept in
    ``namespace`` (the package's globals), so later lookups skip this function."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    return __getattr__
