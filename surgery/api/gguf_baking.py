"""Bake into GGUF files: one value (``bake_recipe`` with a .gguf MODEL) or a sweep over α or n,
one ``OUT/<label>.gguf`` per value, each with its two sidecars; pushed when asked.

The policies are the folder bake's: the recipe is checked against the model it is baked into
(surgery.bake.lineage), a sweep checks every destination and computes every value's edited blocks
(exact, or refused in one line) before it writes the first file, and a push uploads the file, its
sidecars and its card in one commit (surgery/ship/gguf.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.edits import Recipe
from ..core.errors import DestinationError, RecipeError
from ..core.progress import StageProgress, silent_stages
from .baked import Baked, Planned

if TYPE_CHECKING:
    from ..bake.gguf import Prepared


def _opened(model: Path, recipe: Recipe, allow_other_base: bool):
    """The GGUF model, its Source, the recipe checked against it (lineage) and the lineage note."""
    from ..bake.lineage import for_source
    from ..gguf.model import open_gguf
    from ..model.loading import Source

    gguf_model, source = open_gguf(model), Source(model)
    recipe, lineage = for_source(recipe, gguf_model.config, source, allow_other_base=allow_other_base)
    return gguf_model, source, recipe, lineage


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
    prepared: Prepared | None = None,
) -> Baked:
    """Bake into a GGUF file (surgery/bake/gguf.py): only the edited blocks change, each exact or refused
    (or requantized, with ``requantize``); the record and undo go to sidecars next to ``out``; with
    ``push_to`` the three files and a card go to that Hub repo (branch ``push_revision``)."""
    from ..bake.gguf import bake_gguf

    if push_to:
        from ..ship.hub import preflight

        preflight(push_to, push_revision)  # fail before the bake, not after it
    gguf_model, source, recipe, lineage = _opened(model, recipe, allow_other_base)
    if lineage:
        note(lineage)
    result = bake_gguf(
        gguf_model,
        recipe,
        out,
        source=source,
        force=force,
        requantize=requantize,
        extra=dict(extra) if extra else None,
        report=note,
        progress=stages,
        prepared=prepared,
    )
    record = result.provenance
    if push_to:
        from ..ship.hub import push

        record = replace(record, pushed=push(out, push_to, private=private, revision=push_revision))
    return Baked(out, record, ([lineage] if lineage else []) + result.notes, dict(extra) if extra else None)


def sweep_outputs(out: Path, labels: Sequence[str]) -> dict[str, Path]:
    """Where each value of a GGUF sweep goes: ``OUT/<label>.gguf`` (``OUT`` a folder, as a folder
    sweep's ``OUT/<label>``)."""
    if out.suffix.lower() == ".gguf":
        raise DestinationError(
            f"--out {out} is a .gguf file, but a sweep writes one .gguf per value: give a "
            f"folder (e.g. --out {out.with_suffix('')}: {labels[0]}.gguf, … go into it)"
        )
    return {label: out / f"{label}.gguf" for label in labels}


def sweep_gguf(
    model: Path,
    plans: Sequence[Planned],
    out: Path,
    *,
    force: bool = False,
    allow_other_base: bool = False,
    requantize: bool = False,
    push_to: str | None = None,
    on_each: Callable[[str, Baked], None] | None = None,
    **kwargs: Any,
) -> dict[str, Baked]:
    """Bake each plan into ``out/<label>.gguf`` (on the Hub: branch ``<label>`` of ``push_to``).

    Every destination is checked and every value's blocks are computed before the first file is
    written, so a taken destination or a value that cannot be baked exactly fails the sweep with
    nothing written. ``kwargs``: :func:`bake_gguf_recipe`'s (``private``, ``stages``, ``note``).
    """
    from ..bake.gguf import prepare, replaceable
    from ..core.staging import check_container, check_free_file

    outputs = sweep_outputs(out, [p.label for p in plans])
    check_container(out, [model])  # the sweep's folder may exist: it holds the values
    for dest in outputs.values():
        check_free_file(dest, [model], force, replaceable)
    if push_to:
        from ..ship.hub import preflight

        preflight(push_to, plans[0].label)
    prepared = {}
    for plan in plans:  # a refused value leaves no outputs
        gguf_model, _, recipe, _ = _opened(model, plan.recipe, allow_other_base)
        try:
            prepared[plan.label] = prepare(gguf_model, recipe, requantize)
        except RecipeError as exc:  # say which value cannot be baked
            raise RecipeError(f"{plan.label}: {exc}") from None
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for plan in plans:
        baked = bake_gguf_recipe(
            model,
            plan.recipe,
            outputs[plan.label],
            force=force,
            allow_other_base=allow_other_base,
            requantize=requantize,
            extra=plan.extra,
            push_to=push_to,
            push_revision=plan.label if push_to else None,
            prepared=prepared[plan.label],
            **kwargs,
        )
        results[plan.label] = baked
        if on_each is not None:
            on_each(plan.label, baked)
    return results
