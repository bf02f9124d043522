"""The neutral prompts of the KL cost: surgery's retention prompts, a JSONL file of ``{"text": …}``, or a
text file of one prompt a line."""

from __future__ import annotations

from pathlib import Path

from ...core.errors import ParameterError
from ...core.prompts import read_prompts
from ...evaluation.data import read_jsonl, shipped

BUILTIN = "builtin"


def neutral_texts(source: str) -> list[str]:
    """The texts of ``source`` ('builtin', a JSONL or a text file); a record without a text is a one-line error."""
    if source != BUILTIN and Path(source).suffix != ".jsonl":
        return list(read_prompts(source, "neutral").prompts)
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
