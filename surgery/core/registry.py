"""Plug-ins that register themselves by subclassing: a subclass that sets ``name`` is one."""

from __future__ import annotations

from typing import Any

from .errors import SurgeryError


def register(registry: dict[str, Any], cls: type, kind: str) -> None:
    """Add ``cls`` to ``registry`` under its ``name`` (``kind``: "stored formats", for the message);
    a class that does not set ``name`` itself is an abstract intermediate and is left out."""
    if "name" not in cls.__dict__:
        return
    name = cls.__dict__["name"]
    if name in registry:
        raise SurgeryError(
            f"two {kind} are named {name!r} ({registry[name].__qualname__} and {cls.__qualname__}); "
            "give the new one its own name"
        )
    registry[name] = cls
