"""The neutral prompts of the KL cost: surgery's retention prompts, or a JSONL file of ``{"text": …}``."""

from __future__ import annotations

from pathlib import Path

from ...core.errors import ParameterError
from ...evaluation.data import read_jsonl, shipped

BUILTIN = "builtin"


def neutral_texts(source: str) -> list[str]:
    """The texts of ``source`` ('builtin' or a JSONL path); a record without a text is a one-line error."""
    records = shipped("retention_prompts.jsonl") if source == BUILTIN else read_jsonl(Path(source), "neutral prompts")
    texts = []
    for n, r in enumerate(records, 1):
        text = r.get("text") if isinstance(r, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise ParameterError(
                f'{{neutral}} {source}: record {n} has no "text" string; give {{"text": "…"}} per line', "neutral"
            )
        texts.append(text)
    if not texts:
        raise ParameterError(f"{{neutral}} {source} holds no prompts; give at least two lines", "neutral")
    return texts
