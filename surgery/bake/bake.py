"""Copy-on-write bake: the output is the source with only the edited byte ranges changed.

Every file of the source is copied with a kernel copy (content, not symlinks), except shards that
hold an edited tensor: those are streamed through memory once, the edited byte ranges overlaid on
the way. A second copy of the weights outside the loaded files (Mistral's consolidated.safetensors)
is edited the same way, or the bake is refused (surgery/bake/copies.py). Memory stays bounded by
two 16 MB buffers per shard streamed (two at once), whatever the model size. The output carries
``surgery.json`` (provenance, recipe, sha256 of every file) and ``surgery.undo`` (the original bytes
of every edited slice and of every file the bake replaced), so ``surgery undo`` restores the source
exactly.
Every byte is hashed at most once (see ``hashing_record``), on threads that overlap the copy, and
two edited shards are streamed at once, so both cores hash.
"""

from __future__ import annotations

import datetime as _dt
import errno
import os
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..core.checkpoint import SKIP_DIRS, Checkpoint, file_sha256, folder_files, is_other_weights
from ..core.edits import Recipe
from ..core.errors import CheckpointError
from ..core.hash_cache import HashCache
from ..core.patches import group_by_file, patched_chunks
from ..core.progress import StageProgress, silent_stages
from ..core.raw_values import RAW_DTYPES
from ..core.staging import staged_output
from ..core.vectors import VECTORS_NAME
from ..model.loading import Source, local_source
from .copies import copy_note, copy_patches
from .guards import check_scales
from .provenance import (
    OWN_FILES,
    PROVENANCE_NAME,
    UNDO_NAME,
    Spooled,
    UndoSpool,
    UndoValue,
    left_out_note,
    record_text,
    write_undo,
)
from .record import BakeRecord, EditedTensor, HashingRecord, UndoRecord, Verification
from .source_index import remember_source
from .stream import stream_patched

COPY_BLOCK = 64 << 20
HASH_THREADS = 2  # hashlib releases the GIL on large blocks: two files hash in parallel
PATCH_THREADS = 2  # edited shards streamed at once: each hashes its output on its own thread
SHA256_NAME = re.compile(r"[0-9a-f]{64}")


def write_vectors(folder: Path, recipe: Recipe) -> None:
    """``surgery.vectors``: the unit vectors of the recipe's direction edits (none: no file), so
    that the bake's record can be re-read without the files the recipe named."""
    from safetensors.numpy import save

    units = {
        f"{e.sha256}#{e.vector.split('#')[1]}": np.frombuffer(e.unit, dtype=np.float32) for e in recipe.directions
    }  # weight 0 too: the recorded recipe names it
    if units:
        (folder / VECTORS_NAME).write_bytes(save(dict(sorted(units.items()))))


@dataclass
class BakeResult:
    path: Path
    provenance: BakeRecord  # what surgery.json holds
    notes: list[str] = field(default_factory=list)


# One patch's record and the keys of its original bytes in the spool ("rows", "cols", or "block" for a
# projection), until they go to surgery.undo.
Patched = tuple[EditedTensor, dict[str, Spooled]]


def source_files(ckpt: Checkpoint) -> list[str]:
    """Files of the source: everything but VCS/cache folders (``SKIP_DIRS``)."""
    return folder_files(ckpt.path)


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


def _patch_bytes(fd_src: int, p, entries: list[Patched], spool: UndoSpool) -> Iterator[tuple[int, memoryview]]:
    """(offset, new bytes) of one patch, in file order; its record goes to ``entries`` once it is
    done, with the keys of its original slices (spooled to disk as they come: a projected tensor's
    originals are the whole tensor)."""
    key, kinds, stats = f"{p.info.file}:{p.info.name}#{p.first_row}", [], {}
    # No scale overflows here: guards.check_scales refused those before anything was written.
    for offset, data, orig in patched_chunks(fd_src, p, stats):
        for kind, arr in orig.items():
            spool.add(f"{key}.{kind}", arr)
            kinds += [kind] if kind not in kinds else []
        yield offset, data
    window = p.window is not None  # one expert's rows of a fused 3-D tensor
    projected = p.project is not None  # the whole tensor (window) is rewritten; how much of r the rounding left
    entry = EditedTensor(
        tensor=p.info.name,
        file=p.info.file,
        dtype=p.info.dtype,
        rows=sorted(p.rows),
        cols=sorted(p.cols),
        first_row=p.first_row if window else None,
        window=p.window if window else None,
        direction_weight=p.project.weight if projected else None,
        direction_left=stats["left"] if projected else None,
        direction_op="add" if projected and p.project.op == "add" else None,
    )
    entries.append((entry, {kind: Spooled(f"{key}.{kind}") for kind in kinds}))


def patch_span(p) -> tuple[int, int]:
    """The byte range [start, end) of the file that ``p`` may rewrite."""
    row_bytes = p.n_cols * np.dtype(RAW_DTYPES[p.info.dtype]).itemsize
    start = p.info.start + p.first_row * row_bytes
    return start, start + p.n_rows * row_bytes


def _new_bytes(fd_src: int, patches, entries: list[Patched], spool: UndoSpool) -> Iterator[tuple[int, memoryview]]:
    """(offset, new bytes) of every patch of one file, in file order; one record per patch goes to
    ``entries``.

    Patches cover disjoint byte ranges (one tensor each, or one expert's rows of a fused tensor), so
    running them one after the other in order of their ranges gives file order — and only one
    patch's block is in memory at a time (merging them would hold one block per patch).
    """
    last = 0
    for p in sorted(patches, key=patch_span):
        start, end = patch_span(p)
        if start < last:
            raise CheckpointError(
                f"{p.info.file}: '{p.info.name}' overlaps another edited tensor; the file's header is corrupt"
            )
        last = end
        yield from _patch_bytes(fd_src, p, entries, spool)


@dataclass
class PatchedFile:
    """What streaming one edited shard gave: its sha256s and one undo record per patch (plan order),
    each with the original bytes of its slices under ``originals``."""

    source_sha256: str | None
    output_sha256: str
    entries: list[Patched]


def _patch_file(
    src: Path,
    dst: Path,
    patches,
    spool: UndoSpool,
    hash_source: bool = True,
    on_bytes: Callable[[int], None] = lambda n: None,
    stop: threading.Event | None = None,
) -> PatchedFile:
    """Write ``src`` with every patch applied to ``dst`` in one streaming pass (:func:`stream_patched`),
    keeping the original slices for undo."""
    entries: list[Patched] = []
    src_sha, out_sha = stream_patched(
        src, dst, lambda fd: _new_bytes(fd, patches, entries, spool), hash_source, on_bytes, stop
    )
    return PatchedFile(
        src_sha, out_sha, sorted(entries, key=lambda e: (e[0].tensor, e[0].first_row or 0))
    )  # the plan's order


def _record_undo(entries: list[Patched], undo: dict[str, UndoValue], undo_index: list[EditedTensor]) -> None:
    """Move each entry's original slices into ``undo`` under numbered keys, and the entry into
    ``undo_index``; called in file order, so the numbering does not depend on which shard ended first."""
    for entry, originals in entries:
        keys = {kind: f"slice{len(undo_index)}.{kind}" for kind in originals}
        undo.update({keys[kind]: arr for kind, arr in originals.items()})
        entry.rows_key, entry.cols_key, entry.block_key = keys.get("rows"), keys.get("cols"), keys.get("block")
        undo_index.append(entry)


def hashing_record(taken: list[str], remembered: list[str], copied: list[str]) -> HashingRecord:
    """What surgery.json says about its sha256s: which were taken rather than computed."""
    return HashingRecord(
        source_files_from_hub_blob_names=taken,
        # hashed by an earlier bake; unchanged since by device, inode, size, mtime and ctime
        source_files_from_hash_cache=remembered,
        files_from_source=copied,
        computed="every other sha256 in files and source_files, from the bytes, once",
        recheck="surgery verify recomputes every sha256 of the output and of the source",
    )


def hub_blob_sha256(path: Path) -> str | None:
    """The sha256 a Hugging Face cache snapshot file already carries: its blob's name.

    Snapshot files are links to ``blobs/<name>``; for LFS files (the weights) that name is the
    content's sha256, which huggingface_hub checked at download. Git-stored files have a 40-digit
    git hash there instead: None, they are hashed (they are small).
    """
    if not path.is_symlink():
        return None
    target = path.resolve()
    return target.name if target.parent.name == "blobs" and SHA256_NAME.fullmatch(target.name) else None


def hash_files(root: Path, names: list[str]) -> dict[str, str]:
    """sha256 of every file, two at a time (hashlib releases the GIL on large blocks)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(names, pool.map(lambda n: file_sha256(root / n), names)))


@contextmanager
def _threads(workers: int) -> Iterator[tuple[ThreadPoolExecutor, threading.Event]]:
    """A thread pool, and the event that tells its jobs to stop. On any error (Ctrl-C included) the
    queued jobs are dropped, not run over the whole model, and the running ones are waited for,
    even through a second Ctrl-C: the staged folder is removed only once no thread uses it."""
    pool, stop = ThreadPoolExecutor(max_workers=workers), threading.Event()
    try:
        yield pool, stop
    except BaseException:
        while True:  # until the threads are gone: a patch stops within one block
            try:
                stop.set()
                pool.shutdown(wait=True, cancel_futures=True)
                break
            except KeyboardInterrupt:
                continue
        raise
    pool.shutdown(wait=True)


def bake(
    ckpt: Checkpoint,
    recipe: Recipe,
    out: str | Path,
    *,
    source: Source | None = None,
    force: bool = False,
    progress: StageProgress = silent_stages,
    check: Callable[[Path], Verification] | None = None,
    alongside: AbstractContextManager[Callable[[], None] | None] | None = None,
    card: Callable[[Path, BakeRecord], str] | None = None,
    extra: dict[str, Any] | None = None,
    report: Callable[[str], None] = lambda m: None,
    allow_zero: bool = False,
) -> BakeResult:
    """Bake ``recipe`` into a copy of ``ckpt`` at ``out``.

    ``check(staged_dir)`` runs on the finished weights before they are published (the numerical
    check, e.g. ``check.edited_check``) and its result is recorded. ``alongside`` is work done while the
    files are copied (surgery.bake.runnable: the source run once), entered once the destination is
    accepted; what it yields (None: nothing to wait for) is called before the check, and a refusal there
    publishes nothing. ``card(staged_dir, record)`` returns a model card (README.md). ``extra`` adds
    entries (findings summary, selection) to surgery.json.
    A scale that overflows, or one that rounds a head's or neuron's weights to zero (unless
    ``allow_zero``), is refused before anything is written (surgery.bake.guards).
    """
    arch = recipe.validate(ckpt.config)
    check_scales(ckpt, recipe, allow_zero=allow_zero)
    patches = ckpt.format.plan(ckpt, arch, recipe.active())
    copies = copy_patches(ckpt, arch, patches)  # the same edits on second copies of the weights
    by_file = group_by_file(patches + copies)
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
    if copies:
        note(copy_note(copies))
    # Every edited shard must be one of the copied files, or its edit would silently not happen.
    stray = sorted(set(by_file) - set(copied))
    if stray:
        raise CheckpointError(
            f"{ckpt.path}: the weights file {stray[0]} is in a folder that is not carried over "
            f"({', '.join(sorted(SKIP_DIRS))}); move the shards next to config.json"
        )
    unchanged = {rel for rel in copied if rel not in by_file and not (card is not None and rel == "README.md")}
    hash_cache = HashCache()
    with (
        staged_output(Path(out), [ckpt.path], force, note) as tmp,
        _threads(HASH_THREADS) as (hasher, _),
        ExitStack() as closing,
    ):
        spool = UndoSpool(tmp)
        closing.callback(spool.close)
        finish = closing.enter_context(alongside) if alongside is not None else None
        # Every byte is hashed at most once. A Hub-cache source file takes its blob's name; an
        # edited shard's source and output are hashed in the pass that writes it; every other
        # source file is hashed on threads while the main thread copies (the kernel copy leaves
        # the CPU mostly idle), and its copy takes that hash. Left-out files are not hashed: undo
        # restores the carried files, and they may be large.
        # A source file hashed by an earlier bake, and unchanged since, takes that hash too.
        taken = {rel: h for rel in files if rel not in left_out and (h := hub_blob_sha256(ckpt.path / rel))}
        remembered = {
            rel: h
            for rel in files
            if rel not in left_out and rel not in taken and (h := hash_cache.get(ckpt.path / rel))
        }
        source_hashes: dict[str, Any] = {
            rel: hasher.submit(file_sha256, ckpt.path / rel)
            for rel in files
            if rel not in left_out and rel not in taken and rel not in remembered and rel not in by_file
        }
        output_hashes: dict[str, str] = {}
        undo: dict[str, UndoValue] = {}
        undo_index: list[EditedTensor] = []
        done, ticking = 0, threading.Lock()

        def advance(n: int) -> None:  # called by the patch threads too
            nonlocal done
            with ticking:
                done += n
                tick("copy", done, total)

        tick("copy", 0, total)
        tick("patch", 0, len(by_file))
        with _threads(PATCH_THREADS) as (patcher, stop):
            # Edited shards stream on their own threads while this one copies the other files.
            patched: dict[str, Future] = {
                rel: patcher.submit(
                    _patch_file,
                    ckpt.path / rel,
                    tmp / rel,
                    by_file[rel],
                    spool,
                    hash_source=rel not in taken and rel not in remembered,
                    on_bytes=advance,
                    stop=stop,
                )
                for rel in copied
                if rel in by_file
            }
            for rel in copied:
                if rel not in by_file:
                    copy_file(ckpt.path / rel, tmp / rel, advance)
            finished, _ = wait(patched.values(), return_when=FIRST_EXCEPTION)
            for job in finished:  # the first failure, at once: the others stop at their next block
                if job.exception() is not None:
                    raise job.exception()
            for k, rel in enumerate(patched, 1):
                result = patched[rel].result()
                with ticking:
                    tick("patch", k, len(by_file))
                output_hashes[rel] = result.output_sha256
                if result.source_sha256 is not None:
                    source_hashes[rel] = result.source_sha256
                _record_undo(result.entries, undo, undo_index)
        source_hashes.update(taken)
        source_hashes.update(remembered)

        replaced = [n for n in OWN_FILES if n in files]  # an earlier bake's record, kept in surgery.undo
        if card is not None and "README.md" in files:
            replaced.append("README.md")
        record = BakeRecord(
            tool_version=__version__,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            # The fingerprint lets export-lora check that MODEL is the source of a baked folder.
            source=replace(source or local_source(ckpt.path), fingerprint=ckpt.fingerprint()),
            model_type=arch.model_type,
            recipe=recipe,
            edited_tensors=undo_index,
            extra=dict(extra or {}),
            undo=UndoRecord(
                file=UNDO_NAME,
                replaced_files=replaced,
                added_files=[n for n in ("README.md",) if card is not None and n not in files],
                left_out_files=left_out,
            ),
            files={},
            source_files={},  # hashed below, once the card is written
        )
        if finish is not None:
            tick("run", 0, 1)
            finish()
            tick("run", 1, 1)
        if check is not None:
            tick("check", 0, 1)
            record.verification = check(tmp)
            tick("check", 1, 1)
        if card is not None:
            (tmp / "README.md").write_text(card(tmp, record), encoding="utf-8")
        for rel in replaced:
            undo[f"file:{rel}"] = np.frombuffer((ckpt.path / rel).read_bytes(), dtype=np.uint8)
        write_undo(tmp / UNDO_NAME, undo, spool)
        write_vectors(tmp, recipe)
        outputs = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        tick("hash", 0, 1)
        fresh = [n for n in outputs if n not in unchanged and n not in output_hashes and n != PROVENANCE_NAME]
        source_digests = {n: h if isinstance(h, str) else h.result() for n, h in source_hashes.items()}
        for rel, digest in source_digests.items():
            if rel not in taken and rel not in remembered:
                hash_cache.put(ckpt.path / rel, digest)
        hashes = hash_files(tmp, fresh)  # new files: surgery.undo, the card
        hashes.update({n: source_digests[n] for n in unchanged})
        hashes.update(output_hashes)
        record.files = dict(sorted(hashes.items()))
        record.source_files = dict(sorted(source_digests.items()))
        record.hashing = hashing_record(sorted(taken), sorted(remembered), sorted(unchanged))
        tick("hash", 1, 1)
        (tmp / PROVENANCE_NAME).write_text(record_text(record), encoding="utf-8")
        remember_source(record.source)  # surgery.json names it publicly; push finds it here
    hash_cache.save()
    return BakeResult(Path(out), record, notes)
