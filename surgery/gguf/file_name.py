"""The model a GGUF file is named after: its file name less the quantization label.

GGUF files are published under their model's name with the quantization added
(``SmolLM2-135M-Instruct.Q4_1.gguf``, ``gemma-3-270m-q4_k_m.gguf``, llama.cpp's
``Name-Q4_K_M-00001-of-00002.gguf`` for a shard). A recipe names the model it was written for
(``HuggingFaceTB/SmolLM2-135M-Instruct``): without the label the names compare as a folder named
after its repo does (surgery.model.loading.same_model). A folder ``surgery import-gguf`` wrote goes by
its GGUF's names too: its weights are that file's.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

from ..core.errors import CheckpointError
from ..core.strict_files import load_json

MANIFEST_NAME = "surgery.gguf.json"  # an import's record; not surgery.json: that name means "made by a bake"


@cache
def _label() -> re.Pattern[str]:
    """A quantization label at the end of a GGUF file name: llama.cpp's file types (``Q4_K_M``, ``F16``,
    ``MXFP4_MOE``) and tensor types (``Q4_K``), as gguf-py names them, then an optional shard suffix."""
    import gguf

    names = {t.name.removeprefix("MOSTLY_").removeprefix("ALL_") for t in gguf.LlamaFileType}
    names |= {t.name for t in gguf.GGMLQuantizationType}
    names.discard(gguf.LlamaFileType.GUESSED.name)
    alternatives = "|".join(sorted(map(re.escape, names), key=len, reverse=True))  # Q4_K_M before Q4_K
    return re.compile(rf"[-._](?:{alternatives})(?:-\d+-of-\d+)?\.gguf$", re.IGNORECASE)


def model_name(path: Path) -> str:
    """The model ``path`` (a .gguf file) is named after: its name less ``.gguf`` and any quantization label."""
    name = path.name
    label = _label().search(name)
    return name[: label.start()] if label else name.removesuffix(".gguf").removesuffix(".GGUF")


def gguf_names(path: Path) -> set[str]:
    """The names the checkpoint at ``path`` goes by as a GGUF: a .gguf file's name and its model's, an
    import's (a folder holding :data:`MANIFEST_NAME`) those of the file it records; none otherwise."""
    if path.suffix.lower() == ".gguf" and not path.is_dir():
        return {path.name, model_name(path)}
    manifest = path / MANIFEST_NAME
    if not manifest.is_file():
        return set()
    try:
        file = load_json(manifest.read_bytes())["gguf"]["file"]
    except (json.JSONDecodeError, KeyError, TypeError):  # read only for its name: anything else is no import's
        raise CheckpointError(
            f"{manifest} is not the record surgery import-gguf writes; import the file again"
        ) from None
    return {file, model_name(Path(file))}
