"""What a bake returns (:class:`Baked`) and what a sweep bakes (:class:`Planned`, one per value),
shared by the bakes of every container (surgery.api.baking)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bake.record import BakeRecord
from ..core.edits import Recipe


@dataclass
class Baked:
    """One finished bake: where it went, its record (surgery.json), the notes reported on the way,
    and the findings summary that went into surgery.json (``extra``)."""

    out: Path
    provenance: BakeRecord
    notes: list[str]
    extra: dict[str, Any] | None = None

    @property
    def tensors_edited(self) -> int:
        """Distinct tensors the bake changed (a fused expert tensor counts once, not per window)."""
        return len(self.provenance.edited_pairs())

    def summary(self) -> dict[str, Any]:
        """The JSON object the command line prints for this bake (``--json``)."""
        record = self.provenance
        return {
            "out": str(self.out),
            "edits": len(record.recipe.edits),
            "tensors_edited": self.tensors_edited,
            "verification": record.verification.to_dict() if record.verification else None,
            "notes": self.notes,
            "pushed": record.pushed.to_dict() if record.pushed else None,
            **(self.extra or {}),
        }  # the selection / findings summary that went into surgery.json


@dataclass(frozen=True)
class Planned:
    """One output of a sweep: its label (folder and branch name), recipe, and surgery.json extras."""

    label: str | None
    recipe: Recipe
    extra: dict[str, Any] | None = None


def sweep_label(name: str, value: float) -> str:
    """A folder and branch name for one sweep value, e.g. ``alpha-2.5`` or ``n-40``."""
    return f"{name}-{value:g}"
