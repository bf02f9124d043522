"""Copy-on-write bake: the output is the source with only the edited byte ranges changed.

Every file of the source is copied with a kernel copy (content, not symlinks); shards that hold an
edited tensor are then patched in place at the tensor's byte range. Memory stays bounded by a
16 MB block of one tensor, whatever the model size. The output carries ``surgery.json``
(provenance, recipe, sha256 of every file) and ``surgery.undo`` (the original bytes of every edited
slice and of every file the bake replaced), so ``surgery undo`` restores the source exactly.
Hashing runs on two threads while the main thread copies and patches, so it mostly overlaps the copy.
"""

from __future__ import annotations

import datetime as _dt
import errno
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .. import __version__
from ..core.checkpoint import Checkpoint, file_sha256, is_other_weights
from ..core.edits import Recipe
from ..core.errors import CheckpointError, RecipeError
from ..core.progress import StageProgress, silent_stages
from ..core.staging import staged_output
from ..model.loading import Source
from .patches import RAW_DTYPES, group_by_file, patched_chunks, plan, to_f32
from .provenance import FORMAT, OWN_FILES, PROVENANCE_NAME, UNDO_NAME, left_out_note, provenance_text, write_undo

SKIP_DIRS = {".git", ".cache"}
COPY_BLOCK = 64 << 20
HASH_THREADS = 2  # hashlib releases the GIL on large blocks: two files hash in parallel



@dataclass
class BakeResult:
    path: Path
    provenance: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def source_files(ckpt: Checkpoint) -> list[str]:
    """Files to carry over: everything but VCS/cache folders and an earlier bake's own files."""
    out = []
    for root, dirs, names in os.walk(ckpt.path, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for n in sorted(names):
            rel = Path(root, n).relative_to(ckpt.path).as_posix()
            out.append(rel)
    return out


def copy_file(src: Path, dst: Path, on_bytes: Callable[[int], None] = lambda n: None) -> None:
    """Copy content (following symlinks) with copy_file_range: no bytes pass through Python."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        size = os.fstat(fi.fileno()).st_size
        done = 0
        try:
            while done < size:
                n = os.copy_file_range(fi.fileno(), fo.fileno(), min(COPY_BLOCK, size - done))
                if n == 0:
                    break
                done += n
                on_bytes(n)
        except OSError as exc:
            # Filesystems or kernels without copy_file_range between these files: plain copy.
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            fi.seek(done)
            fo.seek(done)
            while block := fi.read(COPY_BLOCK):
                fo.write(block)
                on_bytes(len(block))
                done += len(block)
        if done != size:
            raise OSError(errno.EIO, f"short copy of {src.name} ({done} of {size} bytes)")


def _overflowed(fd_src: int, dtype: str, offset: int, data: bytes) -> bool:
    """True when new bytes hold inf/NaN where the source held finite values (a scale too large for
    the stored dtype, e.g. α = 1e7 on F16 weights): the bake would publish a broken model."""
    new = to_f32(np.frombuffer(data, RAW_DTYPES[dtype]), dtype)
    if np.isfinite(new).all():
        return False  # the common case: no second read of the source
    old = to_f32(np.frombuffer(os.pread(fd_src, len(data), offset), RAW_DTYPES[dtype]), dtype)
    return bool((np.isfinite(old) & ~np.isfinite(new)).any())


def _patch_file(src: Path, dst: Path, patches, undo: dict[str, np.ndarray], undo_index: list[dict]) -> None:
    """Write every patch's new bytes into ``dst``; record the original slices for undo."""
    fd_src = os.open(src, os.O_RDONLY)
    fd_dst = os.open(dst, os.O_WRONLY)
    try:
        for p in patches:
            originals: dict[str, list[np.ndarray]] = {"rows": [], "cols": []}
            with np.errstate(over="ignore"):  # an overflow is one clear error below, not numpy warnings
                for offset, data, orig in patched_chunks(fd_src, p):
                    if _overflowed(fd_src, p.info.dtype, offset, data):
                        raise RecipeError(f"scaling '{p.info.name}' overflows {p.info.dtype} (its values would "
                                          "become inf); choose a smaller scale")
                    if os.pwrite(fd_dst, data, offset) != len(data):
                        raise OSError(errno.ENOSPC, "short write")
                    for kind, arr in orig.items():
                        originals[kind].append(arr)
            entry = {"tensor": p.info.name, "file": p.info.file, "dtype": p.info.dtype,
                     "rows": sorted(p.rows), "cols": sorted(p.cols)}
            if p.window is not None:  # one expert's rows of a fused 3-D tensor
                entry.update(first_row=p.first_row, window=p.window)
            for kind, parts in originals.items():
                if parts:
                    key = f"slice{len(undo_index)}.{kind}"
                    undo[key] = np.concatenate(parts).view(np.uint8)
                    entry[f"{kind}_key"] = key
            undo_index.append(entry)
    finally:
        os.close(fd_src)
        os.close(fd_dst)


def hash_files(root: Path, names: list[str]) -> dict[str, str]:
    """sha256 of every file, two at a time (hashlib releases the GIL on large blocks)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(names, pool.map(lambda n: file_sha256(root / n), names)))


@contextmanager
def _hash_pool() -> Iterator[ThreadPoolExecutor]:
    """Threads for sha256; on any error the queued jobs are dropped, not run over the whole model."""
    pool = ThreadPoolExecutor(max_workers=HASH_THREADS)
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def bake(ckpt: Checkpoint, recipe: Recipe, out: str | Path, *, source: Source | None = None,
         force: bool = False, progress: StageProgress = silent_stages,
         check: Callable[[Path], dict[str, Any]] | None = None,
         card: Callable[[Path, dict[str, Any]], str] | None = None,
         extra: dict[str, Any] | None = None, report: Callable[[str], None] = lambda m: None) -> BakeResult:
    """Bake ``recipe`` into a copy of ``ckpt`` at ``out``.

    ``check(staged_dir)`` runs on the finished weights before they are published (the numerical
    verification) and its result is recorded; ``card(staged_dir, provenance)`` returns a model
    card (README.md). ``extra`` adds entries (findings summary, selection) to surgery.json.
    """
    arch = recipe.validate(ckpt.config)
    patches = plan(ckpt, arch, recipe.active())
    by_file = group_by_file(patches)
    files = source_files(ckpt)
    left_out = sorted(rel for rel in files if is_other_weights(rel))
    # Files that reach the output as exact copies: their sha256 is the source file's.
    copied = [rel for rel in files if rel not in OWN_FILES and rel not in left_out]
    total = sum((ckpt.path / f).stat().st_size for f in copied)
    tick = progress
    notes: list[str] = []

    def note(msg: str) -> None:
        notes.append(msg)
        report(msg)

    if left_out:
        note(left_out_note(left_out))
    # Every edited shard must be one of the copied files, or its edit would silently not happen.
    stray = sorted(set(by_file) - set(copied))
    if stray:
        raise CheckpointError(f"{ckpt.path}: the weights file {stray[0]} is in a folder that is not carried over "
                              f"({', '.join(sorted(SKIP_DIRS))}); move the shards next to config.json")
    unchanged = {rel for rel in copied if rel not in by_file and not (card is not None and rel == "README.md")}
    with staged_output(Path(out), [ckpt.path], force, note) as tmp, _hash_pool() as hasher:
        # Hashing overlaps the copy: the kernel copy leaves the CPU mostly idle, so every source
        # file is hashed while it is copied, and an edited shard's output as soon as it is patched.
        # Left-out files are not hashed: undo restores the carried files, and they may be large.
        source_hashes = {rel: hasher.submit(file_sha256, ckpt.path / rel) for rel in files if rel not in left_out}
        output_hashes = {}
        undo: dict[str, np.ndarray] = {}
        undo_index: list[dict] = []
        done = 0
        tick("copy", 0, total)
        for rel in copied:
            def advance(n: int) -> None:
                nonlocal done
                done += n
                tick("copy", done, total)

            copy_file(ckpt.path / rel, tmp / rel, advance)
            if rel in by_file:
                tick("patch", len(output_hashes), len(by_file))
                _patch_file(ckpt.path / rel, tmp / rel, by_file[rel], undo, undo_index)
                output_hashes[rel] = hasher.submit(file_sha256, tmp / rel)
        tick("patch", len(by_file), len(by_file))

        provenance: dict[str, Any] = {
            "format": FORMAT,
            "version": 1,
            "tool_version": __version__,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            # The fingerprint lets export-lora check that MODEL is the source of a baked folder.
            "source": {**(source or Source(ckpt.path)).to_dict(), "fingerprint": ckpt.fingerprint()},
            "model_type": arch.model_type,
            "recipe": recipe.to_dict(),
            "edited_tensors": undo_index,
            **(extra or {}),
        }
        if check is not None:
            tick("verify", 0, 1)
            provenance["verification"] = check(tmp)
            tick("verify", 1, 1)
        replaced = [n for n in OWN_FILES if n in files]
        if card is not None:
            (tmp / "README.md").write_text(card(tmp, provenance), encoding="utf-8")
            if "README.md" in files:
                replaced.append("README.md")
        for rel in replaced:
            undo[f"file:{rel}"] = np.frombuffer((ckpt.path / rel).read_bytes(), dtype=np.uint8)
        provenance["undo"] = {
            "file": UNDO_NAME,
            "replaced_files": replaced,
            "added_files": [n for n in ("README.md",) if card is not None and n not in files],
            "left_out_files": left_out,
        }
        write_undo(tmp / UNDO_NAME, undo)
        outputs = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        tick("hash", 0, 1)
        fresh = [n for n in outputs if n not in unchanged and n not in output_hashes and n != PROVENANCE_NAME]
        hashes = hash_files(tmp, fresh)  # new files: surgery.undo, the card
        hashes.update({n: source_hashes[n].result() for n in unchanged})
        hashes.update({n: f.result() for n, f in output_hashes.items()})
        provenance["files"] = dict(sorted(hashes.items()))
        provenance["source_files"] = {n: source_hashes[n].result() for n in sorted(source_hashes)}
        tick("hash", 1, 1)
        (tmp / PROVENANCE_NAME).write_text(provenance_text(provenance), encoding="utf-8")
    return BakeResult(Path(out), provenance, notes)
