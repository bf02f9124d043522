"""The before/after table a model card shows: what an evaluation measured, as a bake's record keeps it.

It lives below both the bake, whose record (surgery.json) carries it, and the evaluation, which
makes it from an eval result (surgery.core.evaluation_result.card_summary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .json_record import JsonRecord, entry, listof, part


@dataclass(kw_only=True)
class EvaluationRow(JsonRecord):
    """One row of the card's before/after table."""

    metric: str | None = None
    label: str
    before: float | None = entry(default=None, keep_none=True)
    after: float | None = entry(default=None, keep_none=True)
    retained_pct: float | None = entry(default=None, keep_none=True)


@dataclass(kw_only=True)
class Evaluation(JsonRecord):
    """The before/after table on the card (made from an eval result by surgery.core.evaluation_result.card_summary)."""

    rows: list[EvaluationRow] = entry(codec=listof(part(EvaluationRow)))
    note: str | None = None
    settings: dict[str, Any] | None = None
