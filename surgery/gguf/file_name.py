"""The model a GGUF file is named after: its file name less the quantization label.

GGUF files are published under their model's name with the quantization added
(``SmolLM2-135M-Instruct.Q4_1.gguf``, ``gemma-3-270m-q4_k_m.gguf``, llama.cpp's
``Name-Q4_K_M-00001-of-00002.gguf`` for a shard). A recipe names the model it was written for
(``HuggingFaceTB/SmolLM2-135M-Instruct``): without the label the names compare as a folder named
after its repo does (surgery.model.loading.same_model).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path


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
