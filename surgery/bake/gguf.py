"""Bake a recipe into a GGUF file: the output is the source with only the edited blocks' bytes changed.

The edited blocks are computed first (a few KB to MB: only the blocks of the edited rows and
columns are read), then the source is streamed to the staged output once, 16 MB at a time, the new
blocks overlaid on the way and both files hashed in the same pass (``stream_patched``, the folder
bake's), so a file larger than memory bakes in bounded memory. Next to it go the sidecars
``NAME.gguf.surgery.json`` (the same record a baked folder's surgery.json holds) and
``NAME.gguf.surgery.undo`` (the original bytes of every edited block); all three appear together
or not at all.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..core.checkpoint import file_sha256
from ..core.counted import counted
from ..core.edits import Recipe
from ..core.errors import DestinationError
from ..core.hash_cache import HashCache
from ..core.progress import StageProgress, silent_stages
from ..core.staging import staged_files
from ..gguf import is_gguf
from ..gguf.model import GgufModel
from ..gguf.plan import EditedBlocks, edit_tensor, plan_gguf
from ..model.loading import Source
from .bake import BakeResult
from .provenance import record_text, sidecars, write_undo
from .record import BakeRecord, EditedTensor, UndoRecord, Verification
from .source_index import remember_source
from .stream import stream_patched

CHECK_KIND = "gguf blocks"
CHECK_REFERENCE = (
    "gguf-py dequantize of every edited block equals the source block's values times the recipe's "
    "factors, bit for bit in float32 (requantized blocks: within the recorded error)"
)


def edited_blocks(model: GgufModel, recipe: Recipe, requantize: bool) -> tuple[list[EditedBlocks], list[str]]:
    """The new bytes of every block ``recipe`` edits in ``model``'s file, and the plan's notes."""
    p = plan_gguf(model, recipe)
    fd = os.open(model.path, os.O_RDONLY)
    try:
        return [edit_tensor(fd, te, requantize) for te in p.edits], p.notes
    finally:
        os.close(fd)


Prepared = tuple[list[EditedBlocks], list[str]]  # every edited block's new bytes, and the plan's notes


def prepare(model: GgufModel, recipe: Recipe, requantize: bool) -> Prepared:
    """Check ``recipe`` against ``model`` and compute its edited blocks: exact (or requantized, with
    ``requantize``) or refused in one line, before anything is written."""
    recipe.validate(model.config)
    return edited_blocks(model, recipe, requantize)


def _chunks(blocks: list[EditedBlocks]):
    def new_bytes(fd: int):
        for b in blocks:  # sorted by tensor offset, and tensors do not overlap
            yield from b.chunks()

    return new_bytes


def verification(blocks: list[EditedBlocks]) -> Verification:
    """The bake's check, as recorded: every block was checked by its block type's edit (surgery/gguf/blocks/)."""
    return Verification(
        kind=CHECK_KIND,
        maps=len(blocks),
        max_abs_diff=max((b.result.max_abs_error for b in blocks), default=0.0),
        reference=CHECK_REFERENCE,
    )


def gguf_details(blocks: list[EditedBlocks], notes: list[str], requantize: bool) -> dict[str, Any]:
    """surgery.json's ``gguf`` entry: per tensor its type, blocks, undo keys, and requantization error."""
    tensors = []
    for i, b in enumerate(blocks):
        row = {
            "tensor": b.edit.tensor.name,
            "type": b.edit.tensor.type,
            "blocks": len(b.offsets),
            "undo_offsets": f"tensor{i}.offsets",
            "undo_bytes": f"tensor{i}.original",
        }
        if b.result.requantized:
            row.update(
                requantized_blocks=b.result.requantized,
                max_abs_error=b.result.max_abs_error,
                rel_rms_error=b.result.rel_rms_error,
            )
        tensors.append(row)
    return {"requantize": requantize, "tensors": tensors, "notes": list(notes)}


def undo_arrays(blocks: list[EditedBlocks]) -> dict[str, np.ndarray]:
    """The original bytes of every edited block and their file offsets, keyed as ``gguf_details`` says."""
    out: dict[str, np.ndarray] = {}
    for i, b in enumerate(blocks):
        out[f"tensor{i}.offsets"] = b.offsets.astype(np.int64)
        out[f"tensor{i}.original"] = b.original
    return out


def replaceable(path: Path) -> bool:
    """A GGUF that ``--force`` may replace: one a bake wrote (its sidecar record is there)."""
    return sidecars(path)[0].is_file()


def check_gguf_name(out: Path) -> None:
    """A GGUF model bakes into a GGUF file: refuse an ``out`` named otherwise."""
    if not is_gguf(out):
        raise DestinationError(f"--out {out} must end in .gguf: a GGUF model bakes into a GGUF file")


def bake_gguf(
    model: GgufModel,
    recipe: Recipe,
    out: str | Path,
    *,
    source: Source | None = None,
    force: bool = False,
    requantize: bool = False,
    extra: dict[str, Any] | None = None,
    report: Callable[[str], None] = lambda m: None,
    progress: StageProgress = silent_stages,
    prepared: Prepared | None = None,
) -> BakeResult:
    """Write ``out`` (a .gguf): ``model``'s file with ``recipe`` baked into its blocks, and its sidecars.

    Every edited block is exact (checked against gguf-py's dequantizer) or refused before anything
    is written; with ``requantize``, blocks that cannot be exact are requantized (Q4_0/1, Q5_0/1,
    Q8_0) and the error is measured and recorded. ``prepared``: ``prepare(model, recipe, requantize)``
    computed already (a sweep checks every value before it writes the first).
    """
    out = Path(out)
    check_gguf_name(out)
    notes: list[str] = []

    def note(msg: str) -> None:
        notes.append(msg)
        report(msg)

    progress("check", 0, 1)
    blocks, plan_notes = prepared or prepare(model, recipe, requantize)
    progress("check", 1, 1)
    for msg in plan_notes:
        note(msg)
    requantized = sum(b.result.requantized for b in blocks)
    if requantized:
        note(
            f"{counted(requantized, 'block')} requantized (max |error| {max(b.result.max_abs_error for b in blocks):.3g}); "
            "recorded in the sidecar"
        )
    record_path, undo_path = sidecars(out)
    size = model.path.stat().st_size
    hash_cache = HashCache()
    with staged_files(
        out, [model.path], force, note, replaceable=replaceable, companions=[record_path.name, undo_path.name]
    ) as tmp:
        known = hash_cache.get(model.path)
        progress("copy", 0, size)
        src_sha, out_sha = stream_patched(
            model.path, tmp / out.name, _chunks(blocks), hash_source=known is None, on_bytes=lambda n: None
        )
        progress("copy", size, size)
        src_sha = known or src_sha
        write_undo(tmp / undo_path.name, undo_arrays(blocks))
        record = BakeRecord(
            tool_version=__version__,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            source=Source(
                source.path if source else model.path,
                source.hub_id if source else None,
                source.revision if source else None,
                fingerprint=src_sha,
            ),
            model_type=model.arch.model_type,
            recipe=recipe,
            edited_tensors=[
                EditedTensor(
                    tensor=b.edit.tensor.name,
                    file=out.name,
                    dtype=b.edit.tensor.type,
                    rows=sorted(b.edit.rows),
                    cols=b.edit.columns,
                )
                for b in blocks
            ],
            extra={**(extra or {}), "gguf": gguf_details(blocks, plan_notes, requantize)},
            undo=UndoRecord(file=undo_path.name, replaced_files=[], added_files=[]),
            files={out.name: out_sha, undo_path.name: file_sha256(tmp / undo_path.name)},
            source_files={model.path.name: src_sha},
            verification=verification(blocks),
        )
        (tmp / record_path.name).write_text(record_text(record), encoding="utf-8")
        remember_source(record.source)  # the sidecar names it publicly; push finds it here
    if known is None:
        hash_cache.put(model.path, src_sha)
        hash_cache.save()
    return BakeResult(out, record, notes)
