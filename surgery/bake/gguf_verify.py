"""Verify and undo a baked GGUF from its sidecars alone (the source file is optional).

Overlaying the undo sidecar's original blocks on the baked file must give the source byte for byte
(its recorded sha256): that proves every byte outside the edited blocks is the source's, and that
undo restores it. The edited blocks are recomputed from those originals and the recorded recipe
(the bake's own exactness check against gguf-py's dequantizer runs again) and must equal the baked
file's bytes. One streaming pass over the baked file computes both its sha256 and the restored one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..core.checkpoint import file_sha256
from ..core.counted import counted
from ..core.errors import DestinationError, SurgeryError, VerificationError
from ..core.progress import StageProgress, silent_stages
from ..core.staging import staged_files
from ..gguf import is_gguf
from ..gguf.blocks import block_type
from ..gguf.model import open_gguf
from ..gguf.plan import edit_tensor, plan_gguf, runs
from .gguf import replaceable as baked_output
from .provenance import UndoFile, load_provenance, load_undo, provenance_intact, sidecars
from .record import BakeRecord
from .source_index import local_source_path
from .stream import stream_patched
from .verify import Report


def _originals(record: BakeRecord, saved: UndoFile) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(tensor, offsets, original blocks) per edited tensor, as the sidecar records them.

    The undo file stores raw bytes (surgery.undo's layout): the offsets are little-endian int64 and
    the blocks one row per offset."""
    out = []
    for row in record.extra.get("gguf", {}).get("tensors", []):
        missing = [k for k in (row["undo_offsets"], row["undo_bytes"]) if k not in saved]
        if missing:
            raise VerificationError(f"the undo sidecar lacks '{missing[0]}'; it does not belong to this bake")
        offsets = np.frombuffer(saved.read(row["undo_offsets"]), dtype="<i8")
        blocks = np.frombuffer(saved.read(row["undo_bytes"]), dtype=np.uint8)
        if not len(offsets) or blocks.size % len(offsets):
            raise VerificationError(
                f"the undo sidecar's entry '{row['undo_bytes']}' does not hold "
                f"{len(offsets)} whole blocks; it does not belong to this bake"
            )
        out.append((row["tensor"], offsets, blocks.reshape(len(offsets), -1)))
    return out


def _restore_chunks(originals):
    def chunks(fd: int):
        pieces = sorted((int(o[a]), blocks[a:b]) for _, o, blocks in originals for a, b in runs(o, blocks.shape[1]))
        for offset, data in pieces:
            yield offset, memoryview(np.ascontiguousarray(data).reshape(-1))

    return chunks


def recorded_hashes(record: BakeRecord) -> tuple[str | None, str | None]:
    """(sha256 of the baked GGUF, of its undo sidecar) as recorded; by role, not by name, so the
    three files may be renamed together."""
    gguf = [d for n, d in record.files.items() if n != record.undo.file]
    return (gguf[0] if len(gguf) == 1 else None), record.files.get(record.undo.file)


def _baked_record(baked: Path) -> BakeRecord:
    """The sidecar record of the baked GGUF ``baked`` (refused in one line when it is not a GGUF bake's
    or the undo sidecar is missing)."""
    record = load_provenance(baked)
    if len(record.source_files) != 1 or "gguf" not in record.extra:
        raise VerificationError(
            f"{sidecars(baked)[0].name} is not the record of a GGUF bake; give the .gguf file a bake wrote"
        )
    undo_path = sidecars(baked)[1]
    if not undo_path.is_file():
        raise VerificationError(f"{baked} has no undo sidecar {undo_path.name}; copy it next to the file")
    return record


def _undo_changed(baked: Path, record: BakeRecord) -> str | None:
    """The problem when the undo sidecar is not the one the bake wrote (checked before it is parsed: a
    changed byte would otherwise read as a corrupt file to "re-download or re-save")."""
    undo_path = sidecars(baked)[1]
    if file_sha256(undo_path) != recorded_hashes(record)[1]:
        return f"{undo_path.name} changed after the bake (sha256 differs from the record)"
    return None


def load_baked(baked: Path) -> tuple[BakeRecord, list]:
    """The sidecar record of the baked GGUF ``baked`` and its original blocks (refused in one line when
    the record is not a GGUF bake's, or the undo sidecar is missing or not the one the bake wrote)."""
    record = _baked_record(baked)
    changed = _undo_changed(baked, record)
    if changed:
        raise VerificationError(f"{changed}; put back the sidecar the bake wrote")
    return record, _originals(record, load_undo(sidecars(baked)[1]))


def verify_gguf(baked: str | Path, source: str | Path | None = None, progress: StageProgress = silent_stages) -> Report:
    """Check a baked GGUF against its sidecars (and ``source``, when given); see the module docstring."""
    baked = Path(baked)
    # no model runs (see gguf.md): the blocks are the numeric check; --json said "logits"
    report = Report(
        numeric_check="GGUF blocks: every edited block recomputed from its original and the recipe, exactly"
    )
    record = _baked_record(baked)
    if not provenance_intact(baked):
        report.problems.append(
            f"{sidecars(baked)[0].name} changed after the bake (its content does not match its seal)"
        )
        return report
    changed = _undo_changed(baked, record)
    if changed:
        report.problems.append(changed)
        return report
    originals = _originals(record, load_undo(sidecars(baked)[1]))
    gguf_sha = recorded_hashes(record)[0]
    ((source_name, source_sha),) = record.source_files.items()
    progress("hash", 0, 1)
    baked_sha, restored_sha = stream_patched(baked, Path(os.devnull), _restore_chunks(originals))
    progress("hash", 1, 1)
    report.files_checked = 2
    if baked_sha != gguf_sha:
        report.problems.append(f"{baked.name} changed after the bake (sha256 differs from the record)")
    if restored_sha != source_sha:
        report.problems.append(
            f"{baked.name} with its original blocks put back is not the source {source_name} "
            "(bytes outside the edited blocks differ); bake it again"
        )
    if source is not None and not Path(source).is_file():
        report.problems.append(f"{source} is not a file; give the source GGUF {baked.name} was baked from")
    elif source is not None and file_sha256(Path(source)) != source_sha:
        report.problems.append(
            f"{Path(source).name} is not the source {baked.name} was baked from (its sha256 "
            "differs from the record); verify against that source"
        )
    if report.problems:
        return report
    report.tensors_edited = _check_blocks(baked, record, originals, report)
    return report


def _check_blocks(baked: Path, record: BakeRecord, originals, report: Report) -> int:
    """Recompute every edited block from its original and the recipe; count the tensors checked."""
    try:
        model = open_gguf(baked)  # the metadata is the source's, byte for byte
        edits = {te.tensor.name: te for te in plan_gguf(model, record.recipe).edits}
    except SurgeryError as exc:
        report.problems.append(f"the recorded recipe no longer plans on {baked.name}: {exc}")
        return 0
    requantize = bool(record.extra.get("gguf", {}).get("requantize"))
    if sorted(edits) != sorted(name for name, _, _ in originals):
        report.problems.append("the undo sidecar's edited tensors are not the ones the recorded recipe edits")
        return 0
    fd = os.open(baked, os.O_RDONLY)
    try:
        for name, offsets, original in originals:
            te = edits[name]
            _, nbytes = block_type(te.tensor.type, te.tensor.name).block_shape
            redo = edit_tensor(fd, te, requantize, original=original)
            if not np.array_equal(redo.offsets, offsets):
                report.problems.append(f"{name}: the undo sidecar's blocks are not the ones the recipe edits")
                continue
            for a, b in runs(offsets, nbytes):
                have = os.pread(fd, (b - a) * nbytes, int(offsets[a]))
                if have != redo.result.blocks[a:b].tobytes():
                    report.problems.append(
                        f"{baked.name}: tensor '{name}' differs from what the recipe prescribes; bake it again"
                    )
                    report.mismatches.append({"file": baked.name, "tensor": name})
                    break
    except SurgeryError as exc:
        report.problems.append(f"{baked.name}: {exc}")
    finally:
        os.close(fd)
    return len(edits)


def undo_gguf(
    baked: str | Path, out: str | Path, force: bool = False, report: Callable[[str], None] = lambda msg: None
) -> dict[str, str]:
    """Write the source of the baked GGUF ``baked`` to ``out`` (a file), byte for byte; checked
    against the sha256 recorded at bake time before it is published. Returns {name: sha256}."""
    baked, out = Path(baked), Path(out)
    if not is_gguf(out):
        raise DestinationError(f"--out {out} must end in .gguf: a baked GGUF restores to a GGUF file")
    record, originals = load_baked(baked)
    ((source_name, source_sha),) = record.source_files.items()

    def replaceable(path: Path) -> bool:  # a bake's output, or an earlier restore of this one
        return baked_output(path) or file_sha256(path) == source_sha

    with staged_files(
        out, [baked], force, report, replaceable=replaceable, companions=[p.name for p in sidecars(out)]
    ) as tmp:
        baked_sha, restored = stream_patched(baked, tmp / out.name, _restore_chunks(originals))
        if baked_sha != recorded_hashes(record)[0]:
            raise VerificationError(f"{baked.name} changed after the bake; undo would not give the source")
        if restored != source_sha:
            raise VerificationError(f"undo did not reproduce the source {source_name}; nothing was written")
    return {out.name: restored}


def checked_gguf(baked: str | Path) -> tuple[str, BakeRecord]:
    """Verify the baked GGUF ``baked`` before a push (against its recorded source when that file is
    here): how it was checked and its record, or a one-line refusal."""
    baked = Path(baked)
    record, _ = load_baked(baked)
    src = local_source_path(record.source)
    source = src if src is not None and src.is_file() else None
    report = verify_gguf(baked, source)
    if report.problems:
        more = f"; {counted(len(report.problems) - 1, 'more problem')}" if len(report.problems) > 1 else ""
        raise VerificationError(
            f"{baked} fails verification ({report.problems[0]}{more}); refusing to push: bake it again"
        )
    how = (
        "sidecars' seal and sha256s, the source restored from the undo sidecar"
        + (f" and compared with {source}" if source else " (sha256 as recorded; source not on this machine)")
        + ", every edited block recomputed"
    )
    return how, record
