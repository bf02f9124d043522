"""Whose recipe is baked into which checkpoint.

A recipe names the model it was written for (``base_model``); its α and n were chosen on that
model. Baking it into another one is refused unless the caller allows it (``--allow-other-base``):
the edits may fit the other model's config and still mean nothing there. When allowed, the output
keeps both names: its provenance and card name the checkpoint actually edited as the base (a push
must not publish another model's lineage), and the recipe's notes keep ``written_for``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..core.edits import Recipe
from ..core.errors import RecipeError
from ..model.loading import Source, same_model

WRITTEN_FOR = "written_for"  # the recipe note that keeps the model a recipe was written for


def for_source(
    recipe: Recipe,
    config: Mapping[str, Any],
    source: Source,
    *,
    allow_other_base: bool = False,
    verb: tuple[str, str] = ("bake", "baked"),
) -> tuple[Recipe, str | None]:
    """``recipe`` checked against the checkpoint it is baked into and renamed after it, and the note
    to show when it was written for another model (None otherwise).

    Refused: edits that do not fit ``config`` (saying whose recipe it is, the likely cause), and a
    recipe of another model unless ``allow_other_base``. ``verb``: what the caller does with it and its past
    participle, for the messages.
    """
    edited = source.hub_id or str(source.path)
    other = recipe.base_model if recipe.base_model and not same_model(recipe.base_model, source) else None
    try:
        recipe.validate(config)
    except RecipeError as exc:
        if other:
            raise RecipeError(
                f"{exc}; the recipe was written for {other}, not this model: use a recipe made for it"
            ) from None
        raise
    if other is None:
        return replace(recipe, base_model=edited), None
    if not allow_other_base:
        raise RecipeError(
            f"the recipe was written for {other}, not {edited}: its α and n were chosen on that "
            f"model; use a recipe made for this one, or pass {{allow_other_base}} to {verb[0]} it anyway "
            "(the output then records both names)",
            switches=("allow_other_base",),
        )
    note = (
        f"the recipe was written for {other}, not {edited}; {verb[1]} as --allow-other-base asks: the output "
        f"names {edited} as its base model and keeps {other} as the model the recipe was written for"
    )
    return replace(recipe, base_model=edited, notes={**recipe.notes, WRITTEN_FOR: other}), note
