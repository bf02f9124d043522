"""The recipe export-lora exports: a recipe YAML, or the one a bake recorded in its folder, taken only
over the very weights it was baked from (over any other base the adapter would not reproduce the bake)."""

from __future__ import annotations

from pathlib import Path

from ..core.checkpoint import Checkpoint
from ..core.edits import Recipe
from ..core.errors import RecipeError
from .bake import hash_files
from .provenance import PROVENANCE_NAME, load_provenance, provenance_intact
from .public import public
from .record import BakeRecord


def _source_difference(record: BakeRecord, ckpt: Checkpoint) -> str | None:
    """How ``ckpt`` differs from the weights the bake recorded as its source (None: it holds them)."""
    recorded = record.source.fingerprint
    if recorded is not None:
        now = ckpt.fingerprint()
        return (
            None
            if now == recorded
            else (f"its weights' fingerprint is {now[:12]}…, the bake recorded {recorded[:12]}…")
        )
    # Bakes that predate the recorded fingerprint: the sha256 of every weight file (a full read).
    files = record.source_files
    for name, now in hash_files(ckpt.path, ckpt.weight_files).items():
        if files.get(name) != now:
            return (
                f"its {name} has sha256 {now[:12]}…, the bake recorded "
                f"{files[name][:12] + '…' if files.get(name) else 'no such file'}"
            )
    return None


def baked_folder(path: str | Path) -> Path | None:
    """The baked folder whose recorded recipe ``path`` names (the folder or its surgery.json), or None."""
    path = Path(path)
    return path if path.is_dir() else path.parent if path.name == PROVENANCE_NAME else None


def load_recipe(path: str | Path, ckpt: Checkpoint) -> Recipe:
    """A recipe YAML, or the recipe recorded by a bake (its folder or its surgery.json).

    A baked folder's recipe is used only when ``ckpt`` is the source it was baked from: over any
    other base the adapter would not reproduce that bake.
    """
    path = Path(path)
    folder = baked_folder(path)
    if folder is None and (path.suffix.lower() == ".gguf" or path.name.lower().endswith(".gguf.surgery.json")):
        # read as YAML it was "not valid YAML: fix the syntax" (or a sidecar's keys "unknown")
        raise RecipeError(
            f"{path} is a baked GGUF (or its sidecar): export-lora takes a recipe YAML or a folder baked from "
            'MODEL; write the sidecar\'s "recipe" to a YAML file and give that'
        )
    if folder is None:
        return Recipe.load(path)
    record = load_provenance(folder)
    if not provenance_intact(folder):
        raise RecipeError(
            f"{folder / PROVENANCE_NAME} changed after the bake (its content does not match its "
            "seal), so its recipe cannot be trusted; give the recipe YAML, or bake again"
        )
    difference = _source_difference(record, ckpt)
    if difference:
        source = record.source
        # surgery.json names its source publicly (its folder's name, surgery.bake.public); bakes of 0.1 by path
        here = source.path.resolve() == ckpt.path.resolve() if source.path.is_absolute() else None
        if here or (here is None and str(source.path) == public(str(ckpt.path.resolve()))):
            raise RecipeError(
                f"{ckpt.path} changed since {folder} was baked from it ({difference}): an adapter "
                "over these weights would not reproduce the bake; give the source as it was baked "
                f"(surgery undo {folder} restores it)"
            )
        raise RecipeError(
            f"{folder} was baked from {source.hub_id or source.path}, not from {ckpt.path} "
            f"({difference}): an adapter over this base would not reproduce the bake; give the "
            "source it was baked from as MODEL"
        )
    return record.replayable_recipe(folder)  # direction edits: the vectors the bake kept
