"""Direction vectors and recipes for tests: a safetensors file of random directions next to a recipe."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np


def write_vectors(
    folder: Path,
    hidden: int,
    names: Iterable[str] = ("r",),
    seed: int = 0,
    file: str = "v.safetensors",
    dtype=np.float32,
) -> Path:
    """Random directions (not unit length) of size ``hidden`` under ``names`` in ``folder/file``."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({n: (3 * rng.standard_normal(hidden)).astype(dtype) for n in names}, folder / file)
    return folder / file


def direction_recipe(
    folder: Path, entries: Iterable[str], hidden: int = 32, extra: str = "", kind: str = "direction"
) -> Path:
    """``folder/recipe.yaml`` with one ``kind`` edit (direction, steer) per entry (``layer: 0, module: mlp,
    weight: 1``), each reading ``v.safetensors#r`` unless the entry names its own vector; ``extra``: more
    edits (YAML lines)."""
    write_vectors(folder, hidden, ("r", "s"))
    lines = [f"  - {{type: {kind}, {e}{'' if 'vector' in e else ', vector: v.safetensors#r'}}}\n" for e in entries]
    path = folder / "recipe.yaml"
    path.write_text("version: 1\nedits:\n" + "".join(lines) + extra)
    return path
