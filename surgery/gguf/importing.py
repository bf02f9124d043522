"""Turn a GGUF file (llama.cpp's format) into an ordinary safetensors checkpoint with its tokenizer.

transformers does the dequantization (``GgufConfig(dequantize=True)``) and rebuilds the config and
tokenizer from the file's metadata. Before that expensive step the file's header is read here to
refuse what transformers cannot load, with one line naming the supported architectures. The header
is parsed directly with the ``gguf`` package's type tables: ``gguf.GGUFReader`` materialises every
vocabulary entry as a numpy view and takes ~40 s on a 262k-token vocabulary, this reader < 1 s.
"""

from __future__ import annotations

import json
import mmap
import re
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..core.checkpoint import file_sha256
from ..core.errors import CheckpointError, UnsupportedArchitecture
from ..core.optional import require
from ..core.progress import StageProgress, silent_stages
from ..core.staging import staged_output
from ..core.strict_files import load_json
from .import_stream import SHARD_BYTES, transformers_errors, write_streamed

MANIFEST_NAME = "surgery.gguf.json"  # not surgery.json: that name means "made by a bake"
DTYPES = ("float32", "bfloat16")
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
        raise CheckpointError(f"{path} does not exist or is not a file; give the path of a .gguf file")
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


def _canonical(arch: str) -> str:
    # llama.cpp spells some architectures differently from transformers (qwen2moe / qwen2_moe,
    # gpt-oss / gpt_oss); transformers maps them itself, so compare without separators.
    return re.sub(r"[-_]", "", arch.lower())


def transformers_architectures() -> list[str]:
    """The GGUF architectures the installed transformers can rebuild a model from."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    names = set(GGUF_SUPPORTED_ARCHITECTURES)
    try:  # newer transformers loads some architectures through a second path
        from transformers.integrations.gguf import GGUF_ARCHS

        names |= set(GGUF_ARCHS)
    except ImportError:
        pass
    # The legacy table is keyed by metadata prefix, and two prefixes are not architectures.
    return sorted(names - {"general", "tokenizer"})


def check_supported(header: GgufHeader) -> None:
    """Refuse, in one line, a file whose architecture transformers cannot load."""
    import transformers

    arch = header.architecture
    if not arch:
        raise CheckpointError(f"{header.path.name} has no general.architecture; it is not a model GGUF")
    supported = transformers_architectures()
    if _canonical(arch) not in {_canonical(a) for a in supported}:
        raise UnsupportedArchitecture(
            f"{header.path.name} is a '{arch}' GGUF, which transformers {transformers.__version__} cannot "
            f"dequantize (it supports: {', '.join(supported)}); convert the original checkpoint instead, "
            "or upgrade transformers"
        )


def _whole_model(header: GgufHeader, dtype: str):
    """The model ``from_pretrained`` builds from the file, every tensor dequantized at once."""
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    with transformers_errors(header.path.name):
        return AutoModelForCausalLM.from_pretrained(
            str(header.path.parent),
            gguf_file=header.path.name,
            quantization_config=GgufConfig(dequantize=True),
            dtype=getattr(torch, dtype),
            device_map=None,
        )


def _tokenizer(header: GgufHeader):
    from transformers import AutoTokenizer

    name = header.path.name
    try:
        return AutoTokenizer.from_pretrained(str(header.path.parent), gguf_file=name)
    except (ValueError, KeyError, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"transformers cannot build the tokenizer stored in {name}: {first}") from None


@dataclass
class ImportResult:
    path: Path
    manifest: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    gguf_config: dict[str, Any] | None = None  # the GGUF's transformers config, when the import read it alone


def import_gguf(
    gguf_path: str | Path,
    out: str | Path,
    *,
    dtype: str = "float32",
    force: bool = False,
    report: Callable[[str], None] = lambda msg: None,
    progress: StageProgress = silent_stages,
    shard_bytes: int = SHARD_BYTES,
    gguf_sha256: str | None = None,
) -> ImportResult:
    """Write ``out``: a safetensors checkpoint (config, weights, tokenizer) dequantized from a GGUF.

    The folder appears complete or not at all; ``surgery.gguf.json`` records the GGUF's sha256,
    its architecture and quantization, and the sha256 of every file written. The weights are
    dequantized one block at a time into shards of at most ``shard_bytes`` (a larger tensor gets a
    shard of its own), so memory holds about one block and one shard, not the model. ``gguf_sha256``:
    the file's sha256 when the caller has it (the cached import is keyed by it), else computed.
    """
    if dtype not in DTYPES:
        raise CheckpointError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    gguf_path = Path(gguf_path)
    header = read_gguf_header(gguf_path)
    check_supported(header)
    check_complete(gguf_path, header)
    notes: list[str] = []

    def note(msg: str) -> None:
        notes.append(msg)
        report(msg)

    with staged_output(Path(out), [gguf_path], force, note) as tmp:
        gguf_config = write_streamed(header, dtype, tmp, progress, shard_bytes)
        if gguf_config is None:
            progress("dequantize", 0, 1)  # transformers reads and dequantizes the whole file
            _whole_model(header, dtype).save_pretrained(tmp)
            progress("dequantize", 1, 1)
        progress("write", 0, 1)
        _tokenizer(header).save_pretrained(tmp)
        progress("write", 1, 1)
        _strip_quantization(tmp / "config.json")
        for p in tmp.iterdir():
            if p.suffix == ".safetensors":
                p.chmod(0o644)  # safetensors creates files private; a checkpoint is meant to be shared
        config = load_json((tmp / "config.json").read_text(encoding="utf-8"))
        _note_editability(config, note)
        files = sorted(p.name for p in tmp.iterdir() if p.is_file())
        progress("hash", 0, 1)
        manifest = {
            "format": "surgery-gguf-import",
            "version": 1,
            "tool_version": __version__,
            "transformers_version": _transformers_version(),
            "gguf": {
                "file": gguf_path.name,
                "sha256": gguf_sha256 or file_sha256(gguf_path),
                "bytes": gguf_path.stat().st_size,
                "architecture": header.architecture,
                "file_type": header.file_type,
                "tensor_types": dict(sorted(Counter(header.tensor_types.values()).items())),
            },
            "dtype": dtype,
            "model_type": config.get("model_type"),
            "files": {n: file_sha256(tmp / n) for n in files},
        }
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        progress("hash", 1, 1)
    return ImportResult(Path(out), manifest, notes, gguf_config)


def _strip_quantization(config_path: Path) -> None:
    """The weights are plain floats now: a leftover quantization_config would mislabel them."""
    config = load_json(config_path.read_text(encoding="utf-8"))
    if config.pop("quantization_config", None) is not None:
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _note_editability(config: dict[str, Any], note: Callable[[str], None]) -> None:
    from ..core.architectures import architecture

    try:
        architecture(config)
    except UnsupportedArchitecture as exc:
        note(f"imported, but surgery cannot edit it yet: {exc}")


def _transformers_version() -> str:
    import transformers

    return transformers.__version__
