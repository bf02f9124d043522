"""The Hub repo a GGUF file was converted from, when its metadata names it.

An adapter exported from a GGUF model needs a base PEFT can load: the file itself is not one
(transformers loads a GGUF only with ``gguf_file=``, which ``AutoPeftModelForCausalLM`` does not
pass). llama.cpp's converter records the model's own repo as ``general.source.repo_url`` or
``general.source.url`` (from the model card), older files as ``general.source.huggingface.repository``.
``general.base_model.N.*`` names the model *it* was fine-tuned from (other weights) and
``general.name`` is a title, not an id: neither is read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.hub_id import HUB_ID

# The keys holding a URL (a Hub model's is huggingface.co/org/name), then the older key holding the id itself.
URL_KEYS = ("general.source.repo_url", "general.source.url")
ID_KEY = "general.source.huggingface.repository"
_URL = re.compile(r"^https?://(?:www\.)?(?:huggingface\.co|hf\.co)/([^/?#]+/[^/?#]+?)/?$")
# The Hub's URLs of datasets and Spaces have the shape of a model's: their first part says which.
_NOT_MODELS = ("datasets", "spaces")


def hub_id_of(value: Any, *, url: bool) -> str | None:
    """The model repo id a metadata value names (its Hub URL; with ``url`` False, ``org/name`` too), or None."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    match = _URL.match(text)
    repo = match.group(1) if match else None if url else text
    if repo is None or not HUB_ID.match(repo) or repo.split("/", 1)[0] in _NOT_MODELS:
        return None
    return repo


def hub_origin(metadata: Mapping[str, Any]) -> str | None:
    """The Hub id of the model a GGUF file's ``metadata`` says it was converted from, or None."""
    named = [hub_id_of(metadata.get(key), url=True) for key in URL_KEYS]
    return next((repo for repo in named if repo), None) or hub_id_of(metadata.get(ID_KEY), url=False)


def file_hub_origin(path: Path) -> str | None:
    """The Hub id the GGUF file at ``path`` says it was converted from (its header only is read), or None."""
    from .header import read_gguf_header

    return hub_origin(read_gguf_header(path).metadata)
