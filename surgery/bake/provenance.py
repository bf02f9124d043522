"""What a baked folder says about itself, and the one check that it still says the truth.

A bake writes ``surgery.json`` (tool, source, recipe, sha256 of every file, sealed; its content is
a :class:`~surgery.bake.record.BakeRecord`) and ``surgery.undo`` (the original bytes of every
edited slice). This module owns both names, the seal, reading them back, and
:func:`integrity_problems` — the single check of a baked folder's files against its record that
verify, push, card refresh and export all use.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..core.checkpoint import file_sha256, file_tensors, is_other_weights
from ..core.errors import CheckpointError, SurgeryError, VerificationError
from ..core.finite_json import finite
from ..core.progress import StageProgress, silent_stages
from ..core.strict_files import DuplicateKey, load_json
from ..core.sweeps import RECORD_NAME, is_a_sweep, sweep_values  # noqa: F401 (sweep_values: importable from here)
from ..core.vectors import VECTORS_NAME
from .public import public_values
from .record import FORMAT, BakeRecord  # noqa: F401 (FORMAT stays importable with the file's names)

PROVENANCE_NAME = RECORD_NAME
UNDO_NAME = "surgery.undo"  # safetensors content, but not *.safetensors: loaders glob for those
# The bake's own files; VECTORS_NAME (surgery.vectors) holds the unit vectors of direction edits.
OWN_FILES = (PROVENANCE_NAME, UNDO_NAME, VECTORS_NAME)
COPY_BLOCK = 16 << 20
ADAPTER_PROVENANCE_NAME = "surgery_adapter.json"  # what export-lora records in an adapter folder
SEAL_KEY = "provenance_sha256"  # in surgery.json: see provenance_text
# A baked single file (a GGUF) carries its record and undo as sidecars: NAME.gguf.surgery.json / .surgery.undo.
SIDECAR_SUFFIXES = (".surgery.json", ".surgery.undo")


def sidecars(path: Path) -> tuple[Path, Path]:
    """(record, undo) sidecar paths of the baked single file ``path``."""
    return tuple(Path(f"{path}{suffix}") for suffix in SIDECAR_SUFFIXES)  # type: ignore[return-value]


def record_file(path: Path) -> Path:
    """Where the record of the bake at ``path`` is: a folder's surgery.json, a file's sidecar."""
    path = Path(path)
    return sidecars(path)[0] if path.is_file() else path / PROVENANCE_NAME


def seal(prov: Mapping[str, Any], allow_nan: bool = False) -> str:
    """The sha256 of ``prov``'s content but the seal itself (key order does not count; a missing
    number is null, or with ``allow_nan`` NaN as surgery.json had it before)."""
    body = {k: v for k, v in prov.items() if k != SEAL_KEY}
    body = body if allow_nan else finite(body)
    return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=allow_nan).encode()).hexdigest()


def provenance_text(prov: Mapping[str, Any]) -> str:
    """The exact text of surgery.json: ``prov`` sealed with the sha256 of the rest of its content.

    surgery.json cannot list its own sha256, so it carries a seal instead. ``provenance_intact``
    re-derives the text from the parsed file: a changed value breaks the seal, and a change that
    parses to the same content (whitespace, the case of an exponent's 'e') breaks the text.
    Whoever rewrites surgery.json (the card refresh) writes it with this function.
    """
    return _sealed_text(prov, allow_nan=False)


def _sealed_text(prov: Mapping[str, Any], allow_nan: bool) -> str:
    """surgery.json's text, a missing number as null (``allow_nan``: as NaN, the text of before)."""
    body = {k: v for k, v in prov.items() if k != SEAL_KEY}
    body = body if allow_nan else finite(body)
    return json.dumps({**body, SEAL_KEY: seal(body, allow_nan)}, indent=1, allow_nan=allow_nan) + "\n"


def record_text(record: BakeRecord) -> str:
    """The text of surgery.json for ``record`` (:func:`provenance_text`), whose seal it sets.

    Its local paths are made public (surgery.bake.public): the file is published with the
    checkpoint, and the source's path, the findings' cache files and the user's folders mean nothing
    there; the source stays named by its fingerprint and the sha256 of its files."""
    body = public_values(record.to_dict())
    record.seal = seal(body)
    return provenance_text(body)


def provenance_intact(path: Path) -> bool:
    """True when ``path``/surgery.json is byte for byte what ``provenance_text`` wrote."""
    raw = record_file(path).read_bytes()
    try:
        data = load_json(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):  # a repeated key too: the seal covers one value
        return False
    if not isinstance(data, dict):
        return False
    # a surgery.json written before missing numbers were null holds NaN: sealed as that text
    return raw in (provenance_text(data).encode(), _sealed_text(data, allow_nan=True).encode())


def not_baked(path: Path) -> str:
    """Why ``path`` (which has no surgery.json) is not a baked folder, and what to give instead.

    Surgery's own other outputs are named as such: a sweep holds one baked folder per value, an
    adapter folder is export-lora's.
    """
    path = Path(path)
    if (path / ADAPTER_PROVENANCE_NAME).is_file():
        return (
            f"{path} is a LoRA adapter written by surgery export-lora, not a baked checkpoint; give a folder "
            "that a bake wrote (apply, amplify-heads, prune-neurons)"
        )
    if not path.exists():
        # A typo in the path is the likely cause: "not made by surgery" would send the user looking at the folder.
        return f"{path} does not exist; give the folder (or .gguf file) that a surgery bake wrote"
    values = sweep_values(path)
    if values:
        return is_a_sweep(path, values)
    return f"{path} has no {PROVENANCE_NAME}: it was not made by surgery; give the folder that a surgery bake wrote"


def load_provenance(path: Path) -> BakeRecord:
    """surgery.json of a baked checkpoint (a clear error when it is not one, or of a newer version)."""
    prov = record_file(path)
    if not prov.is_file():
        if Path(path).is_file():
            raise VerificationError(
                f"{path} has no sidecar {prov.name}: it was not made by a surgery bake; give "
                "the file a bake wrote, next to its sidecars"
            )
        raise VerificationError(not_baked(Path(path)))
    try:
        data = load_json(prov.read_text(encoding="utf-8"))
    except DuplicateKey as exc:
        raise VerificationError(
            f"{prov}: {exc.what}; a bake writes each key once, so the file was edited after the bake: bake again"
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise VerificationError(f"{prov} is corrupt (not JSON)") from None
    return BakeRecord.from_dict(data, where=str(prov))


def baked_weights(folder: Path) -> dict[str, str] | None:
    """:meth:`BakeRecord.weight_hashes` of the bake in ``folder``; None when it holds no readable
    surgery.json (such a folder names no bake: the card then refuses an evaluation of it)."""
    if not (Path(folder) / PROVENANCE_NAME).is_file():
        return None
    try:
        return load_provenance(folder).weight_hashes()
    except SurgeryError:  # not a bake's record, or one whose recipe no longer reads
        return None


class UndoSpool:
    """Original bytes of edited slices, spooled to an unnamed temporary file while the bake streams
    them: a projected tensor's originals are the whole tensor, which must not sit in memory.

    Each key's parts are appended in the order given (one patch's blocks come from one thread, in
    order); parts of different keys may interleave. :func:`write_undo` copies them into surgery.undo.
    """

    def __init__(self, folder: Path):
        self._file = tempfile.TemporaryFile(dir=folder)  # no name: nothing to clean up, nothing listed
        self._lock = threading.Lock()
        self._end = 0
        self.parts: dict[str, list[tuple[int, int]]] = {}
        self._rows: dict[str, tuple[int, tuple[int, ...]]] = {}  # key -> (rows so far, shape of a row in bytes)

    def add(self, key: str, data: np.ndarray) -> None:
        """Append the raw bytes of ``data`` (a block of rows, or of bytes when 1-D) to ``key``."""
        data = np.ascontiguousarray(data).view(np.uint8)
        raw = memoryview(data.reshape(-1))
        with self._lock:
            start, self._end = self._end, self._end + raw.nbytes
            self.parts.setdefault(key, []).append((start, raw.nbytes))
            rows, row = self._rows.get(key, (0, data.shape[1:]))
            if row != data.shape[1:]:
                raise ValueError(f"undo spool: rows of shape {data.shape[1:]} added to '{key}', which holds {row}")
            self._rows[key] = (rows + len(data), row)
        while raw.nbytes:  # a short write is retried: the next one fails with the errno (a full disk)
            n = os.pwrite(self._file.fileno(), raw, start)
            raw, start = raw[n:], start + n

    def size(self, key: str) -> int:
        return sum(n for _, n in self.parts.get(key, ()))

    def shape(self, key: str) -> list[int]:
        """The shape ``key``'s bytes are recorded under: rows × bytes per row, as the slices were
        cut (surgery.undo keeps the layout surgery 0.1 wrote)."""
        rows, row = self._rows.get(key, (0, ()))
        return [rows, *row]

    def copy(self, key: str, fd: int) -> None:
        """Write ``key``'s bytes to ``fd`` at its current position, a bounded block at a time."""
        for start, n in self.parts.get(key, ()):
            done = 0
            while done < n:
                block = memoryview(os.pread(self._file.fileno(), min(COPY_BLOCK, n - done), start + done))
                done += len(block)
                while block.nbytes:
                    block = block[os.write(fd, block) :]

    def close(self) -> None:
        self._file.close()


class Spooled(str):
    """An undo entry whose bytes are in an :class:`UndoSpool`, under this key."""


UndoValue = np.ndarray | Spooled


def write_undo(path: Path, arrays: dict[str, UndoValue], spool: UndoSpool | None = None) -> None:
    """surgery.undo: the original slices (uint8, rows × bytes per row), in safetensors format, streamed.

    Laid out as safetensors' own writer does (tensors by name, header padded to 8 bytes), so an
    undo of only in-memory slices is byte-identical to ``safetensors.numpy.save``. Written with
    Python's own I/O: a full disk is an OSError with its errno, and the file gets the same
    permissions as the copied weights.
    """
    arrays = arrays or {"empty": np.zeros(0, dtype=np.uint8)}
    header, offset = {}, 0
    for key in sorted(arrays):
        value = arrays[key]
        if isinstance(value, Spooled):
            n, shape = spool.size(value), spool.shape(value)
        else:
            n, shape = np.asarray(value).nbytes, list(np.ascontiguousarray(value).view(np.uint8).shape)
        header[key] = {"dtype": "U8", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        os.write(fd, struct.pack("<Q", len(text)) + text)
        for key in sorted(arrays):
            value = arrays[key]
            if isinstance(value, Spooled):
                spool.copy(value, fd)
            else:
                data = memoryview(np.ascontiguousarray(value).reshape(-1).view(np.uint8))
                while data.nbytes:
                    data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


class UndoFile:
    """A surgery.undo file, read an entry (or part of one) at a time, never whole."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.entries = file_tensors(self.path.parent, self.path.name)
        except CheckpointError as exc:
            raise VerificationError(f"{path} is corrupt ({exc}); cannot undo") from None

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def read(self, key: str, start: int = 0, size: int | None = None) -> bytes:
        """``size`` bytes of entry ``key`` from byte ``start`` (default: all of it)."""
        info = self.entries.get(key)
        if info is None:
            raise VerificationError(f"{self.path} has no entry '{key}' that surgery.json names; cannot undo")
        size = info.nbytes - start if size is None else size
        if start + size > info.nbytes:
            raise VerificationError(f"{self.path}: entry '{key}' is shorter than surgery.json says; cannot undo")
        with open(self.path, "rb") as f:
            data = os.pread(f.fileno(), size, info.start + start)
        if len(data) != size:
            raise VerificationError(f"{self.path} is truncated; cannot undo")
        return data

    def __getitem__(self, key: str) -> np.ndarray:
        return np.frombuffer(self.read(key), dtype=np.uint8)


def load_undo(path: Path) -> UndoFile:
    """The entries of a surgery.undo file (a clear error when it is corrupt), read lazily."""
    return UndoFile(path)


def left_out_note(names: list[str]) -> str:
    """The note for source files a bake does not carry over (see ``is_other_weights``)."""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (
        f"left out {shown}: weights in a format the bake does not edit (pickle, GGUF, TF or Flax); "
        "published next to the edited safetensors they would load the unedited model"
    )


def other_weight_problems(names: Iterable[str]) -> list[str]:
    """The problem line for each file of a baked folder that holds weights the bake did not edit."""
    return [
        f"{n} holds weights in a format the bake does not edit (pickle, GGUF, TF or Flax): it is an "
        "unedited copy of the model that loaders may pick instead; delete it"
        for n in sorted(names)
        if is_other_weights(n)
    ]


def integrity_problems(
    folder: Path, record: BakeRecord, *, skip: Iterable[str] = (), progress: StageProgress = silent_stages
) -> list[str]:
    """Everything wrong with ``folder`` against its own ``record``: a broken seal, a recorded
    file missing or changed (sha256), weights the bake does not edit, a file nobody recorded.

    ``skip`` names recorded files not to hash (the card refresh is about to replace the card).
    ``progress("hash", done, total)`` follows the hashing.
    """
    folder = Path(folder)
    if not provenance_intact(folder):
        return [f"{PROVENANCE_NAME} changed after the bake (its content does not match its seal)"]
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    # Flagged even when recorded: earlier bakes copied such files, unedited, into the output.
    problems = other_weight_problems(present)
    recorded = sorted((n, d) for n, d in record.files.items() if n not in set(skip))
    for i, (name, digest) in enumerate(recorded):
        progress("hash", i, len(recorded))
        if not (folder / name).is_file():
            problems.append(f"{name} is listed in {PROVENANCE_NAME} but missing")
        elif file_sha256(folder / name) != digest:
            problems.append(f"{name} changed after the bake (sha256 differs from {PROVENANCE_NAME})")
    progress("hash", len(recorded), len(recorded))
    known = set(record.files) | {PROVENANCE_NAME}
    problems += [
        f"{n} is not recorded in {PROVENANCE_NAME}" for n in sorted(present - known) if not is_other_weights(n)
    ]  # those were reported above, with what they mean
    return problems
