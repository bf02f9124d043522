"""The model card of a baked GGUF, rendered from its sidecar record.

A baked GGUF is three files (``NAME.gguf`` and its two sidecars) and no folder, so its card is
not written next to it: its container renders it from ``NAME.gguf.surgery.json``
(``GgufContainer.card``) when the file is pushed (surgery.ship.hub.checked_uploads). The card says what a
baked folder's card says (edits, findings, verification, recipe), with what only a GGUF has: the
tensors' block types, the blocks edited, requantization errors and the plan's notes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ..core.counted import counted
from .card import edits_section, evaluation_section, recipe_yaml, render_card, why_section
from .provenance import sidecars
from .public import public
from .record import BakeRecord


def _blocks_section(gguf: dict[str, Any]) -> str:
    """Per edited tensor its block type and blocks edited (and any requantization error), then the notes."""
    rows = [
        "| tensor | type | blocks edited | requantized | max abs error | relative RMS error |",
        "|---|---|---|---|---|---|",
    ]
    for t in gguf.get("tensors", []):
        requantized = t.get("requantized_blocks", 0)
        errors = f"{t['max_abs_error']:.3g} | {t['rel_rms_error']:.3g}" if requantized else "0 (exact) | 0 (exact)"
        rows.append(f"| `{t['tensor']}` | {t['type']} | {t['blocks']} | {requantized} | {errors} |")
    notes = "".join(f"\n- {n}" for n in gguf.get("notes", []))
    return "\n".join(rows) + (f"\n\nNotes:\n{notes}" if notes else "")


def gguf_card(baked: Path, record: BakeRecord) -> str:
    """README.md for the baked GGUF file ``baked`` (``record``: its sidecar record)."""
    name, (record_name, undo_name) = baked.name, (p.name for p in sidecars(baked))
    gguf = record.extra.get("gguf", {})
    ((source_name, source_sha),) = record.source_files.items()
    source = public(str(record.source.path)) or source_name
    recipe = record.recipe
    tags = ["surgery", "model-surgery", "gguf"] + sorted({t for e in recipe.edits for t in e.card_tags()})
    ver = record.verification
    requantize = " --requantize" if gguf.get("requantize") else ""
    sections = [
        f"# {source} — edited with surgery\n\n"
        f"`{name}` is the GGUF file **{source}** (sha256 `{source_sha}`) with {counted(len(recipe.edits), 'edit')} baked "
        f"into its quantized blocks by `surgery` {record.tool_version}. Only the bytes of the edited blocks differ "
        "from the source: its metadata, tokenizer and every other tensor are byte-identical, so llama.cpp, Ollama "
        "and LM Studio run it as they run the source.",
        "## What was edited\n\n" + edits_section(recipe, record_name=record_name),
        "## GGUF blocks\n\n" + _blocks_section(gguf),
        # the gguf entry has its own section; the findings summaries are the other extras
        "## Why\n\n" + why_section(replace(record, extra={k: v for k, v in record.extra.items() if k != "gguf"})),
        "## Verification\n\n"
        f"Before publishing, every edited block of the {counted(ver.maps, 'edited tensor') if ver else '? edited tensors'} was checked: "
        f"{ver.reference if ver else 'not recorded'} (max |error| {ver.max_abs_diff if ver else 0:.3g}). "
        f"With the original blocks kept in `{undo_name}` put back, `{name}` is the source byte for byte (its "
        f"sha256 is in `{record_name}`); `surgery verify {source_name} {name}` checks both again, no model loaded.",
    ]
    if (evaluation := evaluation_section(record.evaluation)) is not None:
        sections.append("## Evaluation: before and after\n\n" + evaluation)
    sections.append(
        "## Reproduce or undo\n\n```yaml\n" + recipe_yaml(recipe) + "\n```\n\n"
        f"`surgery apply recipe.yaml --model {source_name} --out {name}{requantize}` bakes the same file; "
        f"`surgery undo {name} --out {source_name}` restores the source byte for byte from `{undo_name}`. "
        "Keep the three files together (they may be renamed together)."
    )
    return render_card(dict(tags=tags), "\n\n".join(sections))
