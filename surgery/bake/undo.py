"""Restore the source of a baked checkpoint, byte for byte, from its ``surgery.undo``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..core.checkpoint import Checkpoint, TensorInfo, file_tensors, folder_files, is_other_weights
from ..core.errors import VerificationError
from ..core.patches import TensorPatch, restored_chunks
from ..core.raw_values import RAW_DTYPES
from ..core.staging import staged_output
from .bake import copy_file, hash_files, source_files
from .provenance import COPY_BLOCK, OWN_FILES, PROVENANCE_NAME, UNDO_NAME, UndoFile, load_provenance, load_undo
from .record import BakeRecord


def _restore_whole(fd: int, saved: UndoFile, key: str, start: int, size: int) -> None:
    """Put back a whole rewritten tensor (window) of ``size`` bytes at ``start``, a block at a time."""
    if key not in saved or saved.entries[key].nbytes != size:
        raise VerificationError(
            f"{saved.path}: entry '{key}' does not hold the {size} bytes surgery.json names; cannot undo"
        )
    for done in range(0, size, COPY_BLOCK):
        os.pwrite(fd, saved.read(key, done, min(COPY_BLOCK, size - done)), start + done)


def earlier_restore(folder: Path, expected: dict[str, str]) -> bool:
    """Whether ``folder`` holds exactly the files undo writes, with the recorded sha256s: an earlier
    restore of the same bake. A restore is the source byte for byte, so it carries no marker of
    surgery's; its content is what lets ``--force`` replace it (nothing is lost: it is rewritten)."""
    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    return bool(expected) and names == sorted(expected) and hash_files(folder, names) == expected


def _refuse_changed_files(baked: Path, record: BakeRecord) -> None:
    """A recorded file removed, or a file added since the bake, named before anything is read (the
    restore's check would call an added file one that "differs", and a removed one was a bare OS error)."""
    present = set(folder_files(baked))  # as undo reads the folder: .git and .cache are not the model's
    # The card (README.md) is the bake's, not the source's: undo writes the source's own in its place, so
    # a card edited or removed by hand since (before a push, say) does not stand in the way.
    missing = sorted(set(record.files) - present - record.undo.rewritten())
    if missing:
        raise VerificationError(
            f"{baked / missing[0]} is recorded in {PROVENANCE_NAME} but missing; put it back, then undo"
        )
    added = sorted(n for n in present - set(record.files) - set(OWN_FILES) if not is_other_weights(n))
    if added:
        raise VerificationError(
            f"{baked / added[0]} was added after the bake (not in {PROVENANCE_NAME}); move it out of {baked}, then undo"
        )


def undo(
    baked: str | Path, out: str | Path, force: bool = False, report: Callable[[str], None] = lambda msg: None
) -> dict[str, str]:
    """Write the source checkpoint of ``baked`` to ``out``; return the restored files' sha256s.

    The result is checked against the source hashes recorded at bake time before it is published.
    ``report`` receives notes (leftovers of interrupted runs that were cleaned up). ``force``
    replaces an earlier restore of this bake, an empty folder or a surgery output at ``out``.
    """
    baked = Path(baked)
    record = load_provenance(baked)
    expected = record.source_files
    _refuse_changed_files(baked, record)
    read = sorted(set(record.files) - record.undo.rewritten())  # the files undo takes bytes from
    mismatched = [n for n, h in hash_files(baked, read).items() if h != record.files[n]]
    if mismatched:
        raise VerificationError(
            f"{baked / mismatched[0]} changed after the bake; undo would not give the source: put the file back "
            f"as the bake wrote it ({PROVENANCE_NAME} has its sha256), or take the source from where it came"
        )
    saved = load_undo(baked / UNDO_NAME)
    ckpt = Checkpoint(baked, allow_remote_code=True)
    skip = set(OWN_FILES) | record.undo.rewritten()

    with staged_output(
        Path(out), [baked], force, report, replaceable=lambda folder: earlier_restore(folder, expected)
    ) as tmp:
        carried = [rel for rel in source_files(ckpt) if rel not in skip]
        for rel in carried:
            copy_file(baked / rel, tmp / rel)
        for rel in record.undo.replaced_files:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(saved[f"file:{rel}"].tobytes())
        headers: dict[str, dict[str, TensorInfo]] = {}
        for entry in record.edited_tensors:
            # By file and name: a second copy of the weights (copies.py) holds the same tensor again.
            if entry.file not in carried:
                raise VerificationError(
                    f"surgery.json records an edit in {entry.file!r}, which is not a file "
                    f"of {baked}; undo cannot restore it"
                )
            if entry.file not in headers:
                headers[entry.file] = file_tensors(baked, entry.file)
            info = headers[entry.file].get(entry.tensor)
            if info is None:
                raise VerificationError(
                    f"surgery.json records an edit of '{entry.tensor}', which is not in "
                    f"{baked / entry.file}; undo cannot restore it"
                )
            patch = TensorPatch(
                info,
                rows={r: 0.0 for r in entry.rows},
                cols={c: 0.0 for c in entry.cols},
                first_row=entry.first_row or 0,
                window=entry.window,
            )
            fd = os.open(tmp / entry.file, os.O_RDWR)
            try:
                if entry.block_key:  # a projected tensor: every byte of it was rewritten
                    row_bytes = patch.n_cols * np.dtype(RAW_DTYPES[info.dtype]).itemsize
                    _restore_whole(
                        fd, saved, entry.block_key, info.start + patch.first_row * row_bytes, patch.n_rows * row_bytes
                    )
                    continue
                raw = np.dtype(RAW_DTYPES[info.dtype])
                cols = saved[entry.cols_key].view(raw).reshape(patch.n_rows, -1) if entry.cols_key else None
                rows = saved[entry.rows_key].view(raw).reshape(len(entry.rows), -1) if entry.rows_key else None
                for offset, data in restored_chunks(fd, patch, cols, rows):
                    os.pwrite(fd, data, offset)
            finally:
                os.close(fd)
        restored = hash_files(tmp, sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file()))
        if expected and restored != expected:
            bad = sorted(set(restored.items()) ^ set(expected.items()))
            raise VerificationError(f"undo did not reproduce the source ({bad[0][0]} differs); nothing was written")
    left_out = record.undo.left_out_files or []
    if left_out:
        report(
            f"{', '.join(left_out)} of the source {'was' if len(left_out) == 1 else 'were'} left out of "
            "the bake (weights in a format it does not edit) and cannot be restored from it; copy "
            f"{'it' if len(left_out) == 1 else 'them'} from the original source if needed"
        )
    return restored
