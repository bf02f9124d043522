"""GGUF files: edit them in place (bake, verify, ship) or import them as safetensors checkpoints.

What every command asks of a MODEL argument, whether it names a GGUF file, lives here, so that
asking does not import the GGUF reader.
"""

from __future__ import annotations

from pathlib import Path

SUFFIX = ".gguf"


def is_gguf(path: str | Path) -> bool:
    """Whether MODEL names a GGUF file (by its suffix; the header is checked when it is opened)."""
    return str(path).lower().endswith(SUFFIX)
