"""Bake into GGUF files under the names they had before the bake became one path for every container:
:func:`bake_gguf_recipe` is :func:`~surgery.api.baking.bake_recipe` with a .gguf MODEL and
:func:`sweep_gguf` is :func:`~surgery.api.baking.bake_sweep` (one ``OUT/<label>.gguf`` per value),
each with its switches as keywords.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..bake.gguf_container import GgufContainer, sweep_outputs  # noqa: F401 (callers import it from here)
from ..core.edits import Recipe
from ..core.progress import StageProgress, silent_stages
from ..model.loading import LoadSpec
from .bake_options import BakeOptions
from .baked import Baked, Planned


def bake_gguf_recipe(
    model: Path,
    recipe: Recipe,
    out: Path,
    *,
    force: bool = False,
    allow_other_base: bool = False,
    requantize: bool = False,
    extra: Mapping[str, Any] | None = None,
    push_to: str | None = None,
    push_revision: str | None = None,
    private: bool = False,
    stages: StageProgress = silent_stages,
    note: Callable[[str], None] = lambda m: None,
    prepared: Any = None,
) -> Baked:
    """Bake into the GGUF file ``out`` (and its two sidecars); ``prepared``: ``surgery.bake.gguf.prepare``'s
    result for this recipe, computed already."""
    from .baking import bake_into

    options = BakeOptions(
        force=force, allow_other_base=allow_other_base, requantize=requantize, push_to=push_to, private=private
    )
    return bake_into(
        GgufContainer(model),
        recipe,
        Path(out),
        bake=options,
        load=LoadSpec(),
        extra=extra,
        push_revision=push_revision,
        stages=stages,
        note=note,
        prepared=prepared,
    )


def sweep_gguf(
    model: Path,
    plans: Sequence[Planned],
    out: Path,
    *,
    force: bool = False,
    allow_other_base: bool = False,
    requantize: bool = False,
    push_to: str | None = None,
    private: bool = False,
    on_each: Callable[[str, Baked], None] | None = None,
    stages: StageProgress = silent_stages,
    note: Callable[[str], None] = lambda m: None,
) -> dict[str, Baked]:
    """Bake each plan into ``out/<label>.gguf`` (on the Hub: branch ``<label>`` of ``push_to``)."""
    from .baking import bake_sweep

    options = BakeOptions(
        force=force, allow_other_base=allow_other_base, requantize=requantize, push_to=push_to, private=private
    )
    return bake_sweep(model, plans, out, bake=options, on_each=on_each, stages=stages, report=note)
