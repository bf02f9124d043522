"""The header of a GGUF file (llama.cpp's format): its version, metadata and tensor table, and the size
of each tensor's data.

The header is parsed directly with the ``gguf`` package's type tables: ``gguf.GGUFReader`` materialises
every vocabulary entry as a numpy view and takes ~40 s on a 262k-token vocabulary, this reader < 1 s.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import CheckpointError, not_a_file
from ..core.optional import require

MAGIC = b"GGUF"


@dataclass(frozen=True)
class GgufTensor:
    """Where one tensor's data lies in a GGUF file, and how it is stored."""

    name: str
    type: str  # ggml type name (Q4_1, F32, …) or "type N" when gguf does not know N
    shape: tuple[int, ...]  # PyTorch order (out, in): GGUF lists ne0 (the input dimension) first
    offset: int  # absolute byte offset of the data in the file


@dataclass(frozen=True)
class GgufHeader:
    """What the header of a GGUF file says: metadata scalars and the type, shape and place of every tensor."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensor_types: dict[str, str] = field(default_factory=dict)  # tensor name -> ggml type name
    tensors: dict[str, GgufTensor] = field(default_factory=dict)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def file_type(self) -> str | None:
        """The quantization the file declares (e.g. MOSTLY_Q4_1), when it declares one."""
        gguf = require("gguf")
        code = self.metadata.get("general.file_type")
        try:
            return gguf.LlamaFileType(code).name if code is not None else None
        except ValueError:
            return f"file_type {code}"


class _Cursor:
    """Sequential little/big-endian reads over a memory-mapped file, with bounds checks."""

    def __init__(self, buf: mmap.mmap, path: Path, endian: str):
        self.buf, self.path, self.endian, self.pos = buf, path, endian, 0

    def read(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise CheckpointError(f"{self.path.name} is truncated inside its GGUF header; re-download it")
        (value,) = struct.unpack_from(self.endian + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.read("Q")
        if self.pos + n > len(self.buf):
            raise CheckpointError(f"{self.path.name} is truncated inside its GGUF header; re-download it")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")


def _scalar_formats() -> dict[int, str]:
    T = require("gguf").GGUFValueType
    return {
        T.UINT8: "B",
        T.INT8: "b",
        T.UINT16: "H",
        T.INT16: "h",
        T.UINT32: "I",
        T.INT32: "i",
        T.FLOAT32: "f",
        T.BOOL: "?",
        T.UINT64: "Q",
        T.INT64: "q",
        T.FLOAT64: "d",
    }


def _value(cur: _Cursor, vtype: int, formats: dict[int, str]) -> Any:
    """One metadata value; arrays are skipped and reported as their length (vocabularies are big)."""
    T = require("gguf").GGUFValueType
    if vtype == T.STRING:
        return cur.string()
    if vtype == T.ARRAY:
        etype, n = cur.read("I"), cur.read("Q")
        if etype in formats:
            skip = n * struct.calcsize(formats[etype])
            cur.pos += skip
        elif etype == T.STRING:  # a vocabulary: hop over each length-prefixed string
            unpack, buf, pos = struct.Struct(cur.endian + "Q").unpack_from, cur.buf, cur.pos
            for _ in range(n):
                pos += 8 + unpack(buf, pos)[0]
            if pos > len(buf):
                raise CheckpointError(f"{cur.path.name} is truncated inside its GGUF header; re-download it")
            cur.pos = pos
        else:
            for _ in range(n):
                _value(cur, etype, formats)
        return n
    if vtype not in formats:
        raise CheckpointError(
            f"{cur.path.name}: unknown GGUF metadata type {vtype}; the file is corrupt "
            "or newer than the installed gguf package (pip install -U gguf)"
        )
    return cur.read(formats[vtype])


def read_gguf_header(path: str | Path) -> GgufHeader:
    """Parse a GGUF file's header (metadata scalars, tensor types) without reading tensor data."""
    gguf = require("gguf")

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} {not_a_file(path)}; give the path of a .gguf file")
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise CheckpointError(f"{path.name} is not a GGUF file (no GGUF magic bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            (version,) = struct.unpack_from("<I", buf, 4)
            endian = "<" if version < 0x10000 else ">"  # big-endian files read as a huge version
            cur = _Cursor(buf, path, endian)
            cur.pos = 4
            version = cur.read("I")
            if version < 2:
                raise CheckpointError(
                    f"{path.name} is GGUF version {version}; only version 2 and later "
                    "are supported: convert it again with a current llama.cpp"
                )
            n_tensors, n_kv = cur.read("Q"), cur.read("Q")
            formats = _scalar_formats()
            metadata = {}
            for _ in range(n_kv):
                key = cur.string()
                metadata[key] = _value(cur, cur.read("I"), formats)
            tensor_types, places = {}, []
            for _ in range(n_tensors):
                name = cur.string()
                n_dims = cur.read("I")  # read first: `cur.pos += cur.read(...)` would lose the read
                dims = tuple(cur.read("Q") for _ in range(n_dims))
                code = cur.read("I")
                try:
                    tensor_types[name] = gguf.GGMLQuantizationType(code).name
                except ValueError:
                    tensor_types[name] = f"type {code}"
                places.append((name, dims[::-1], cur.read("Q")))
            align = int(metadata.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT))
            start = -(-cur.pos // align) * align  # tensor data begins at the next multiple of the alignment
            tensors = {name: GgufTensor(name, tensor_types[name], shape, start + rel) for name, shape, rel in places}
    return GgufHeader(path, version, metadata, tensor_types, tensors)


def tensor_bytes(t: GgufTensor) -> int | None:
    """Size of ``t``'s data in bytes; None for a type gguf-py does not know."""
    gguf = require("gguf")
    try:
        values, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t.type]]
    except KeyError:
        return None
    count = 1
    for d in t.shape:
        count *= d
    return count // values * nbytes


def check_complete(path: Path, header: GgufHeader) -> None:
    """Refuse a file whose tensor data runs past its end (a truncated download), in one line."""
    size = path.stat().st_size
    for t in header.tensors.values():
        n = tensor_bytes(t)
        if n is not None and t.offset + n > size:
            raise CheckpointError(
                f"{path.name} is truncated: tensor {t.name} ends at byte {t.offset + n}, the file "
                f"has {size}; download it again"
            )
