"""Ship a baked GGUF: what a push uploads, the three files and a card its container renders.

A baked GGUF is three files (``NAME.gguf`` and its two sidecars) and no folder, so its card is
not written next to it: it is rendered from ``NAME.gguf.surgery.json`` when the file is pushed
(surgery/bake/gguf_card.py) and uploaded as the repo's README.md, in the same commit as the three
files.
"""

from __future__ import annotations

from pathlib import Path

from ..bake.card import CARD_NAME
from ..bake.gguf_container import GgufContainer


def checked_upload(baked: str | Path) -> tuple[str, dict[str, bytes | Path]]:
    """Verify the baked GGUF ``baked`` (against its recorded source when that file is here) and
    return how it was checked and what a push uploads: {name in the repo: file or bytes}."""
    container = GgufContainer(baked)
    how, record = container.check_pushable()
    files: dict[str, bytes | Path] = {**(container.uploads() or {})}
    files[CARD_NAME] = container.card(record).encode("utf-8")
    return how, files
