"""GGUF files as surgery reads them: the header, the block types, the tensor-name map, the edited
blocks of a recipe, and the import as a safetensors checkpoint. Everything here depends on
surgery.core alone, so that loading a model (surgery.model) may open a GGUF; baking into one is
surgery/bake/gguf.py (verify and undo: surgery/bake/gguf_verify.py, its card: surgery/bake/gguf_card.py),
its push surgery/ship/hub.py, as every bake output's.

What every command asks of a MODEL argument, whether it names a GGUF file, lives here, so that
asking does not import the GGUF reader.
"""

from __future__ import annotations

from pathlib import Path

SUFFIX = ".gguf"


def is_gguf(path: str | Path) -> bool:
    """Whether MODEL names a GGUF file (by its suffix; the header is checked when it is opened)."""
    return str(path).lower().endswith(SUFFIX)
