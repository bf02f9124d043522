"""Turn a GGUF file (llama.cpp's format) into an ordinary safetensors checkpoint with its tokenizer.

transformers does the dequantization (``GgufConfig(dequantize=True)``) and rebuilds the config and
tokenizer from the file's metadata. Before that expensive step the file's header is read here to
refuse what transformers cannot load, with one line naming the supported architectures (the header
reader: surgery/gguf/header.py).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..core.checkpoint import file_sha256
from ..core.errors import CheckpointError, DestinationError, UnsupportedArchitecture
from ..core.progress import StageProgress, silent_stages
from ..core.staging import staged_output
from ..core.strict_files import load_json
from .file_name import MANIFEST_NAME
from .header import GgufHeader, check_complete, read_gguf_header
from .import_stream import SHARD_BYTES, plan_streamed, transformers_errors, write_streamed
from .metadata_once import metadata_read_once, tensor_name_maps_built_once

DTYPES = ("float32", "bfloat16")


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
    shard of its own), each spooled to disk as its tensors come, so memory holds about one block,
    not the model. ``gguf_sha256``:
    the file's sha256 when the caller has it (the cached import is keyed by it), else computed.
    """
    if dtype not in DTYPES:
        raise CheckpointError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if Path(out).suffix.lower() == ".gguf":  # a folder of that name would pass for the GGUF file itself
        raise DestinationError(
            f"--out {out} ends in .gguf, but import-gguf writes a checkpoint folder (safetensors, config, "
            "tokenizer): name the folder otherwise"
        )
    gguf_path = Path(gguf_path)
    header = read_gguf_header(gguf_path)
    check_supported(header)
    check_complete(gguf_path, header)
    notes: list[str] = []

    def note(msg: str) -> None:
        notes.append(msg)
        report(msg)

    with staged_output(Path(out), [gguf_path], force, note) as tmp, tensor_name_maps_built_once():
        with metadata_read_once(gguf_path):  # config, processors' config and tokenizer: one reading
            plan = plan_streamed(header, dtype)
            if plan is None:
                progress("dequantize", 0, 1)  # transformers reads and dequantizes the whole file
                _whole_model(header, dtype).save_pretrained(tmp)
                progress("dequantize", 1, 1)
            progress("write", 0, 1)
            _tokenizer(header).save_pretrained(tmp)
            progress("write", 1, 1)
        # The metadata's reading (~150 MB of Python objects for a 262k-token vocabulary) is released
        # before the weights are dequantized, so that it is not held beside the largest tensor.
        gguf_config = None if plan is None else write_streamed(plan, tmp, progress, shard_bytes)
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
