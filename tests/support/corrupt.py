"""Craft broken checkpoints for the hardening tests: bad headers, truncations, hostile pickles.

Each function takes a healthy checkpoint folder (a copy the test owns) and breaks one thing, so a
test can name exactly which defect the CLI must refuse.
"""

from __future__ import annotations

import json
import pickle
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

WEIGHTS = "model.safetensors"


def read_raw(path: Path) -> tuple[dict[str, Any], bytes]:
    """(header dict, data section) of a safetensors file, without any checking."""
    blob = path.read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + length]), blob[8 + length :]


def write_raw(path: Path, header: dict[str, Any], data: bytes, declared: int | None = None) -> None:
    """Write ``header`` + ``data`` as a safetensors file; ``declared`` overrides the length field."""
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads the header to 8 bytes
    length = len(text) if declared is None else declared
    path.write_bytes(struct.pack("<Q", length) + text + data)


def edit_header(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``change`` to the header of ``path`` in place, keeping the data section."""
    header, data = read_raw(path)
    change(header)
    write_raw(path, header, data)


def tensor_names(header: dict[str, Any]) -> list[str]:
    return sorted(n for n in header if n != "__metadata__")


def first_two_in_file_order(header: dict[str, Any]) -> tuple[str, str]:
    names = sorted(tensor_names(header), key=lambda n: header[n]["data_offsets"][0])
    return names[0], names[1]


# --- header corruptions ---------------------------------------------------------------------


def truncate(path: Path, keep: float = 0.5) -> None:
    """Cut the file, as an interrupted download does."""
    blob = path.read_bytes()
    path.write_bytes(blob[: int(len(blob) * keep)])


def truncate_to(path: Path, n: int) -> None:
    path.write_bytes(path.read_bytes()[:n])


def overlap_offsets(path: Path) -> None:
    """Make the second tensor start inside the first one (sizes stay consistent)."""

    def change(h: dict[str, Any]) -> None:
        a, b = first_two_in_file_order(h)
        begin, end = h[b]["data_offsets"]
        shift = min(begin - h[a]["data_offsets"][0], end - begin) // 2 or 1
        h[b]["data_offsets"] = [begin - shift, end - shift]

    edit_header(path, change)


def offsets_past_end(path: Path) -> None:
    """Move the last tensor beyond the end of the file."""

    def change(h: dict[str, Any]) -> None:
        last = max(tensor_names(h), key=lambda n: h[n]["data_offsets"][1])
        begin, end = h[last]["data_offsets"]
        h[last]["data_offsets"] = [begin + 4096, end + 4096]

    edit_header(path, change)


def size_disagrees(path: Path) -> None:
    """Claim a shape that needs more bytes than the tensor's byte range holds."""

    def change(h: dict[str, Any]) -> None:
        name = tensor_names(h)[0]
        h[name]["shape"] = [d * 2 for d in h[name]["shape"]] or [2]

    edit_header(path, change)


def absurd_header_length(path: Path) -> None:
    """A length field of 2**60 bytes: a reader that trusts it would try to allocate an exabyte."""
    header, data = read_raw(path)
    write_raw(path, header, data, declared=1 << 60)


def header_not_json(path: Path) -> None:
    header, data = read_raw(path)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + b"\xff" * len(text) + data)


def repeat_entry(path: Path) -> None:
    """Give one tensor's header entry twice (a JSON reader would silently keep the last)."""
    header, data = read_raw(path)
    name = tensor_names(header)[0]
    entry = json.dumps({name: header[name]}, separators=(",", ":"))[1:-1]
    text = ("{" + entry + "," + json.dumps(header, separators=(",", ":"))[1:]).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def retype(path: Path, name: str, dtype: str) -> None:
    """Store ``name`` as another dtype with the same byte size (as a quantized export would)."""
    sizes = {"F32": 4, "F16": 2, "BF16": 2, "I8": 1, "U8": 1, "F8_E4M3": 1}

    def change(h: dict[str, Any]) -> None:
        old = h[name]
        ratio = sizes[old["dtype"]] // sizes[dtype]
        old["shape"] = old["shape"][:-1] + [old["shape"][-1] * ratio]
        old["dtype"] = dtype

    edit_header(path, change)


def drop_tensor(path: Path, name: str) -> None:
    """Remove one tensor (header entry and bytes), leaving a valid but incomplete file."""
    header, data = read_raw(path)
    meta = header.pop(name)
    begin, end = meta["data_offsets"]
    for other in tensor_names(header):
        b, e = header[other]["data_offsets"]
        if b >= end:
            header[other]["data_offsets"] = [b - (end - begin), e - (end - begin)]
    write_raw(path, header, data[:begin] + data[end:])


# --- other broken inputs --------------------------------------------------------------------


class _Trap:
    """Unpickling this runs code (touches a marker file): proof that nobody unpickled it."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def pickle_weights(folder: Path, name: str, marker: Path) -> None:
    """Replace the safetensors weights by a hostile pickle named ``name``."""
    (folder / WEIGHTS).unlink()
    (folder / name).write_bytes(pickle.dumps({"model.embed_tokens.weight": _Trap(marker)}))


def edit_config(folder: Path, **changes: Any) -> None:
    """Update config.json (``None`` deletes a key)."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config, indent=2))
