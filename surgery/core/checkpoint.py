"""Read a safetensors checkpoint without loading it: files, config, headers, tensor byte ranges.

Only safetensors are read. Pickle-based weights (``.bin``, ``.pt``, ``.pth``, ``.ckpt``) can run
arbitrary code when loaded, so a folder that only has those is refused with a conversion hint.
Every header is checked (length, offsets, sizes) before any byte range is trusted.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from . import stored_format
from .errors import CheckpointError
from .stored_format import StoredFormat
from .strict_files import DuplicateKey, load_json
from .sweeps import is_a_sweep, sweep_values

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# Weights in formats a bake does not edit (pickles, GGUF, TF, Flax) and their shard indexes. Next to
# the edited safetensors they would be a second, unedited copy of the model that loaders pick by a
# flag (use_safetensors=False) or by tool (llama.cpp reads the .gguf): a bake leaves them out.
OTHER_WEIGHT_SUFFIXES = (*PICKLE_SUFFIXES, ".gguf", ".h5", ".msgpack")
# The safetensors format caps the JSON header at 100 MB; anything larger is corrupt or hostile.
MAX_HEADER_BYTES = 100 * 1024 * 1024
REFETCH = "re-download or re-save it"
DTYPE_SIZES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
}
# Keys of config.json that mean the weights are quantized: byte ranges are not plain floats.
QUANTIZATION_KEYS = ("quantization_config", "compression_config")
# Folders of a checkpoint that are not part of it (version control, download caches).
SKIP_DIRS = {".git", ".cache"}
# The files a tokenizer is read from (transformers' names and those of its tokenizer classes): the
# vocabulary, merges, special tokens and the chat template (chat_template.jinja / .json, the
# additional_chat_templates folder, or tokenizer_config.json's "chat_template"). They decide which
# tokens a finder reads, so they are part of the model key (:meth:`Checkpoint.model_key`).
TOKENIZER_FILES = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template*",
    "vocab*",
    "merges.txt",
    "*.model",
    "*.tiktoken",
)
CHAT_TEMPLATE_DIR = "additional_chat_templates"


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes are: ``file`` and the absolute byte range [start, end)."""

    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_safetensors_header(path: Path) -> tuple[int, dict[str, Any]]:
    """Parse and check a safetensors header; return (data start offset, header dict)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise CheckpointError(
                f"{path.name} is truncated (shorter than a safetensors header); re-download or re-save it"
            )
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER_BYTES or length > size - 8:
            raise CheckpointError(
                f"{path.name} declares a {length}-byte header but the file has "
                f"{size} bytes: the file is truncated or not safetensors; {REFETCH}"
            )
        try:
            header = load_json(f.read(length))
        except DuplicateKey as exc:  # two entries for one tensor: which bytes are the weight?
            raise CheckpointError(
                f"{path.name} has a header that gives {exc.key!r} twice: the file is corrupt or crafted; {REFETCH}"
            ) from None
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise CheckpointError(
                f"{path.name} has a header that is not valid JSON: the file is corrupt; re-download or re-save it"
            ) from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path.name} has a malformed header (not a JSON object); {REFETCH}")
    _check_layout(path, header, 8 + length, size)
    return 8 + length, header


def _check_layout(path: Path, header: dict[str, Any], data_start: int, size: int) -> None:
    """Offsets must tile the data section without overlap and match shape × dtype."""
    spans = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = meta["dtype"], meta["shape"], meta["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path.name}: tensor '{name}' has a malformed header entry; {REFETCH}") from None
        # Types first: a crafted header may hold lists or objects where strings and ints belong.
        if (
            not isinstance(dtype, str)
            or dtype not in DTYPE_SIZES
            or not isinstance(shape, list)
            or not all(type(d) is int and d >= 0 for d in shape)
        ):
            raise CheckpointError(
                f"{path.name}: tensor '{name}' has dtype {dtype!r} / shape {shape!r} "
                f"that safetensors does not allow; {REFETCH}"
            )
        if not (type(begin) is int and type(end) is int and 0 <= begin <= end):
            raise CheckpointError(f"{path.name}: tensor '{name}' has invalid offsets [{begin!r}, {end!r}); {REFETCH}")
        if end - begin != math.prod(shape) * DTYPE_SIZES[dtype]:
            raise CheckpointError(
                f"{path.name}: tensor '{name}' spans {end - begin} bytes but "
                f"shape {shape} × {dtype} needs {math.prod(shape) * DTYPE_SIZES[dtype]}; "
                f"the file is corrupt: {REFETCH}"
            )
        if data_start + end > size:
            raise CheckpointError(
                f"{path.name}: tensor '{name}' runs past the end of the file "
                "(truncated download?); re-download or re-save it"
            )
        spans.append((begin, end, name))
    spans.sort()
    for (_, e1, n1), (b2, _, n2) in zip(spans, spans[1:]):
        if b2 < e1:
            raise CheckpointError(
                f"{path.name}: tensors '{n1}' and '{n2}' overlap in the file; it is corrupt or crafted: {REFETCH}"
            )


def folder_files(root: Path) -> list[str]:
    """Every file under ``root`` (links followed), as sorted relative POSIX paths, except in ``SKIP_DIRS``."""
    out = []
    for folder, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        out += [Path(folder, n).relative_to(root).as_posix() for n in sorted(names)]
    return out


def file_tensors(root: Path, rel: str) -> dict[str, TensorInfo]:
    """Every tensor of the safetensors file ``root``/``rel``, from its checked header (absolute byte ranges)."""
    start, header = read_safetensors_header(root / rel)
    out = {}
    for name, meta in header.items():
        if name != "__metadata__":
            b, e = meta["data_offsets"]
            out[name] = TensorInfo(name, rel, meta["dtype"], tuple(meta["shape"]), start + b, start + e)
    return out


def is_other_weights(rel: str) -> bool:
    """True for a weights file (or its shard index) in a format other than safetensors."""
    name = rel.rsplit("/", 1)[-1].lower()
    return name.endswith(OTHER_WEIGHT_SUFFIXES) or name.endswith(
        tuple(f"{s}.index.json" for s in OTHER_WEIGHT_SUFFIXES)
    )


# Bytes per sha256 update when hashing a file: read into one reused buffer small enough that sha256
# finds the slice just read in the core's cache (8 MB reads into fresh bytes objects: 1.27x slower over 2 GB here).
HASH_SLICE = 1 << 20


def file_sha256(path: Path, chunk: int = HASH_SLICE) -> str:
    """sha256 of a file's content (symlinks followed)."""
    h = hashlib.sha256()
    view = memoryview(bytearray(chunk))
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            h.update(view[:n])
    return h.hexdigest()


class Checkpoint:
    """A local checkpoint folder (plain, sharded, or a Hub-cache snapshot with symlinks)."""

    def __init__(self, path: str | Path, *, allow_remote_code: bool = False):
        self.path = Path(path)
        if not self.path.exists():
            raise CheckpointError(f"{self.path} does not exist; give a checkpoint folder or a Hub id")
        if not self.path.is_dir():
            if self.path.suffix.lower() == ".gguf":  # the folder that holds a GGUF file is no checkpoint
                raise CheckpointError(
                    f"{self.path} is a GGUF file, which this command does not read; import it first: "
                    f"surgery import-gguf {self.path} --out DIR, and give DIR"
                )
            raise CheckpointError(f"{self.path} is a file; give the checkpoint folder that holds it")
        self.config = self._read_config()
        self._refuse_unsafe(allow_remote_code)
        self.weight_files = self._weight_files()

    def _read_config(self) -> dict[str, Any]:
        cfg = self.path / "config.json"
        if not cfg.is_file():
            if values := sweep_values(self.path):
                raise CheckpointError(is_a_sweep(self.path, values))
            raise CheckpointError(
                f"{self.path} has no config.json; give the folder that holds config.json and the *.safetensors weights"
            )
        try:
            config = load_json(cfg.read_text(encoding="utf-8"))
        except DuplicateKey as exc:
            raise CheckpointError(f"{cfg}: {exc.what}, so it is unclear which value holds; keep one") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{cfg} is not valid JSON ({exc.__class__.__name__}); {REFETCH}") from None
        if not isinstance(config, dict):
            raise CheckpointError(f"{cfg} is not a JSON object; {REFETCH}")
        return config

    def _configs(self) -> list[dict[str, Any]]:
        """The config and its text model's (the same dict for a text-only model)."""
        from .architectures import text_config

        return [self.config, text_config(self.config)]

    @cached_property
    def format(self) -> StoredFormat:
        """How the weights are stored (surgery/formats/): the registered format that recognises the
        quantization_config, or plain floats."""
        return stored_format.detect(self._configs())

    @property
    def quantized(self) -> bool:
        """Whether the weights are FP8 or integer codes that surgery edits through their scales."""
        return self.format.quantized

    def _refuse_unsafe(self, allow_remote_code: bool) -> None:
        for cfg in self._configs():
            for key in QUANTIZATION_KEYS:
                value = cfg.get(key)
                known = key == "quantization_config" and stored_format.known(value)
                if value and not known and (why := stored_format.refusal(value)):
                    raise CheckpointError(f"{self.path} holds {why}")
                if value and not known:
                    method = (
                        (cfg[key] or {}).get("quant_method", "unknown") if isinstance(cfg[key], dict) else "unknown"
                    )
                    raise CheckpointError(
                        f"{self.path} is quantized ({key}: {method}); its weights are packed integers or "
                        "scaled in a layout surgery does not know, so scaling their bytes would corrupt "
                        f"them; use {stored_format.offered()} checkpoint"
                    )
        if self.config.get("auto_map") and not allow_remote_code:
            raise CheckpointError(
                f"{self.path} needs custom code (auto_map in config.json); it is not run unless you "
                "pass --trust-remote-code after reading that code"
            )

    def _weight_files(self) -> list[str]:
        index = self.path / INDEX_NAME
        if index.is_file():
            try:
                weight_map = load_json(index.read_text(encoding="utf-8"))["weight_map"]
                files = sorted(set(weight_map.values()))
            except DuplicateKey as exc:
                raise CheckpointError(
                    f"{index}: {exc.what}, so it is unclear which shard holds it; {REFETCH}"
                ) from None
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                raise CheckpointError(f"{index} is malformed (no weight_map); re-download or re-save it") from None
            # Shards live in the folder: a name that leaves it would be read (and its edits
            # planned) outside the checkpoint, where a bake never copies it.
            outside = [f for f in files if not isinstance(f, str) or Path(f).is_absolute() or ".." in Path(f).parts]
            if outside:
                raise CheckpointError(
                    f"{INDEX_NAME} names shard {outside[0]!r} outside {self.path}; the index "
                    f"is corrupt or crafted: {REFETCH}"
                )
            missing = [f for f in files if not (self.path / f).is_file()]
            if missing:
                raise CheckpointError(
                    f"{INDEX_NAME} names shard {missing[0]} which is missing from "
                    f"{self.path}; the download is incomplete: {REFETCH}"
                )
            return files
        if (self.path / SINGLE_NAME).is_file():
            return [SINGLE_NAME]
        others = sorted(f for f in os.listdir(self.path) if f.endswith(".safetensors"))
        broken = [f for f in [SINGLE_NAME, *others] if os.path.lexists(self.path / f) and not (self.path / f).is_file()]
        if broken:
            raise CheckpointError(
                f"{self.path / broken[0]} is not a readable file (a folder, or a link to a "
                f"missing Hub-cache blob); {REFETCH}"
            )
        if others:
            return others
        pickles = sorted(f for f in os.listdir(self.path) if f.endswith(PICKLE_SUFFIXES))
        if pickles:
            raise CheckpointError(
                f"{self.path} only has pickle weights ({pickles[0]}); loading pickles can run arbitrary "
                "code, so surgery refuses them: convert to safetensors first (save_pretrained with "
                "safe_serialization=True from a trusted environment)"
            )
        raise CheckpointError(
            f"{self.path} has no weights (*.safetensors); give the folder that holds "
            "config.json and the *.safetensors weights"
        )

    # --- tensors -------------------------------------------------------------------------------
    @cached_property
    def tensors(self) -> dict[str, TensorInfo]:
        """Every tensor's location, from the (checked) headers of all weight files."""
        out: dict[str, TensorInfo] = {}
        for fname in self.weight_files:
            for name, info in file_tensors(self.path, fname).items():
                if name in out:
                    raise CheckpointError(f"tensor '{name}' appears in both {out[name].file} and {fname}")
                out[name] = info
        return out

    def tensor(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            raise CheckpointError(
                f"tensor '{name}' is not in {self.path}; the checkpoint does not match "
                f"its config (or the architecture table is wrong for it): {REFETCH}"
            )
        return info

    def total_bytes(self) -> int:
        return sum((self.path / f).stat().st_size for f in self.weight_files)

    @property
    def origin(self) -> Path:
        """What the user named for these weights, as findings record it: this folder (a GGUF's
        import names its .gguf file: surgery/gguf/imported.py)."""
        return self.path

    def tokenizer_files(self) -> list[str]:
        """The tokenizer's files in this folder (:data:`TOKENIZER_FILES`), relative, sorted."""
        from fnmatch import fnmatch

        names = [
            p.name for p in self.path.iterdir() if p.is_file() and any(fnmatch(p.name, g) for g in TOKENIZER_FILES)
        ]
        templates = self.path / CHAT_TEMPLATE_DIR
        if templates.is_dir():
            names += [f"{CHAT_TEMPLATE_DIR}/{p.name}" for p in templates.iterdir() if p.is_file()]
        return sorted(names)

    def model_key(self) -> str:
        """What the model side of a cache key is: the weights' :meth:`fingerprint` and the sha256 of
        every tokenizer file, the chat template among them.

        Findings depend on both: the same weights behind another tokenizer or chat template read other
        tokens (find-direction's ``--template auto``, find-heads' prompt format), so a change to either
        must miss the cache, while the fingerprint alone still says "the same weights" (findings
        apply across tokenizers, see surgery.find.findings.check_model).
        """
        tokenizer = {name: file_sha256(self.path / name) for name in self.tokenizer_files()}
        blob = json.dumps({"weights": self.fingerprint(), "tokenizer": tokenizer}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def fingerprint(self) -> str:
        """A cheap identity for the weights: config, headers and 16 sampled 64 KiB blocks per file.

        Reading every byte of a large model just to key a cache would cost more than the bake;
        sampled blocks still tell fine-tunes of one base model apart.
        """
        h = hashlib.sha256(json.dumps(self.config, sort_keys=True).encode())
        for fname in self.weight_files:
            path = self.path / fname
            size = path.stat().st_size
            h.update(fname.encode())
            with open(path, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                h.update(f.read(length))
                for k in range(16):
                    f.seek(8 + length + (size - 8 - length) * k // 16)
                    h.update(f.read(65536))
        return h.hexdigest()
