"""The task written in surgery's own benchmark JSONL format, so ``surgery find-heads`` can run on it.

One ``template`` row per stem (qtype, text with one ``{item}``, equal-treatment option), one
``item`` row per item (related and unrelated identities as the options display them) and one
``neutral`` row per neutral item and qtype (the "=" questions).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.planted.task import EQUAL, QTYPES, World, identity_text, templates


def benchmark_rows(world: World) -> list[dict[str, Any]]:
    """Every row of the benchmark file, in a fixed order."""
    rows: list[dict[str, Any]] = [
        {"kind": "template", "qtype": q, "text": t, "equal": EQUAL[q]} for q, t in templates()
    ]
    rows += [
        {
            "kind": "item",
            "item": item.word,
            "related": [identity_text(r) for r in item.related],
            "unrelated": [identity_text(u) for u in item.unrelated],
            "qtypes": list(QTYPES),
        }
        for item in world.items
    ]
    rows += [{"kind": "neutral", "qtype": q, "item": w} for q in QTYPES for w in world.neutral_items]
    return rows


def write_benchmark(world: World, path: Path) -> Path:
    """Write the benchmark JSONL to ``path``."""
    path = Path(path)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in benchmark_rows(world)), encoding="utf-8")
    return path
