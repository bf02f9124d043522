"""Bake a recipe into a copy of a model, with every policy a bake carries — the one path the
commands and Python callers share.

:func:`bake_recipe` opens MODEL, checks the recipe against the model it is baked into
(surgery.bake.lineage: a recipe written for another model is refused unless ``allow_other_base``),
refuses scales that vanish or overflow in the stored dtype (surgery.bake.guards, inside the bake),
runs the bake's own check of every edited weight map (surgery.bake.check) unless ``verify=False``
(and, while the files are copied, runs the source once in transformers: surgery.bake.runnable),
writes the model card and pushes the result when asked. :func:`bake_sweep` bakes one output per
value of a sweep (α or n), every destination and every value's scales checked before the first bake.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..bake.record import Evaluation
from ..core.edits import Recipe
from ..core.errors import ParameterError, RecipeError
from ..core.progress import StageProgress, silent_stages
from ..model.loading import LoadSpec, open_checkpoint
from ._common import no_other_options, reporter, typed
from .baked import Baked, Planned, sweep_label  # noqa: F401 (sweep_label: callers import it from here)


def bake_recipe(
    model: str | Path,
    recipe: Recipe,
    out: str | Path,
    *,
    load: LoadSpec | None = None,
    force: bool = False,
    verify: bool = True,
    allow_other_base: bool = False,
    allow_zero: bool = False,
    extra: Mapping[str, Any] | None = None,
    evaluation: Evaluation | Mapping[str, Any] | None = None,
    push_to: str | None = None,
    push_revision: str | None = None,
    private: bool = False,
    requantize: bool = False,
    stages: StageProgress = silent_stages,
    report: Callable[[str], None] | None = None,
    **options: Any,
) -> Baked:
    """Bake ``recipe`` into a copy of ``model`` at ``out`` (written atomically) and return what happened.

    Args:
        model: a checkpoint folder, a Hub id (``org/name``), or a GGUF file (then ``out`` is a
            .gguf file too: see :mod:`surgery.api.gguf_baking`).
        recipe: the edits; a recipe written for another model is refused unless ``allow_other_base``
            (the output then records both names).
        out: the output folder; an existing one is refused unless ``force`` and it is a surgery
            output (or empty).
        verify: run the source once (one forward pass, where its weights fit in memory: a model
            transformers cannot build or run is refused) and the bake's check of every edited weight
            map, before publishing.
        allow_zero: accept a non-zero scale that rounds a head's or neuron's weights to zero.
        extra: entries added to surgery.json (findings summaries); ``evaluation``: rows of the card's
            before/after table.
        push_to: push the result to this Hub repo (branch ``push_revision``; ``private`` when created).
        requantize: GGUF only: requantize the blocks an edit cannot change exactly (Q4_0/1, Q5_0/1,
            Q8_0), the error measured and recorded; without it such an edit is refused.
        stages: progress callback ``(stage, done, total)``; ``report``: notes (default: the
            ``surgery`` logger).
        options: load options (``revision``, ``trust_remote_code``, ``device`` …: see ``LoadSpec``).
    """
    from ..bake.bake import bake
    from ..bake.check import edited_check
    from ..bake.lineage import for_source
    from ..bake.runnable import runs_alongside
    from ..ship.card import card_hook

    load = typed(LoadSpec, options, load)
    no_other_options("bake_recipe", options, LoadSpec)
    note = reporter(report)
    from ..gguf import is_gguf

    if is_gguf(model):
        from .gguf_baking import bake_gguf_recipe

        return bake_gguf_recipe(
            Path(model),
            recipe,
            Path(out),
            force=force,
            allow_other_base=allow_other_base,
            requantize=requantize,
            extra=extra,
            push_to=push_to,
            push_revision=push_revision,
            private=private,
            stages=stages,
            note=note,
        )
    if requantize:
        raise ParameterError(
            "{requantize} applies to GGUF models only (a safetensors bake rounds to the stored dtype); drop it",
            "requantize",
        )
    if push_to:
        from ..ship.hub import preflight

        preflight(push_to, push_revision)  # fail before a long bake, not after it
    ckpt, source = open_checkpoint(str(model), load)
    recipe, lineage = for_source(recipe, ckpt.config, source, allow_other_base=allow_other_base)
    notes = [lineage] if lineage else []
    if lineage:
        note(lineage)

    def noted(message: str) -> None:  # a note before the bake's own: kept with the lineage note
        notes.append(message)
        note(message)

    if evaluation is not None and not isinstance(evaluation, Evaluation):
        evaluation = Evaluation.from_dict(dict(evaluation))
    result = bake(
        ckpt,
        recipe,
        out,
        source=source,
        force=force,
        progress=stages,
        check=edited_check(ckpt, recipe) if verify else None,
        alongside=runs_alongside(ckpt, load, noted) if verify else None,
        extra=dict(extra) if extra else None,
        card=card_hook(evaluation),
        report=note,
        allow_zero=allow_zero,
    )
    record = result.provenance
    if push_to:
        from ..ship.hub import push

        record = replace(record, pushed=push(out, push_to, private=private, revision=push_revision))
    return Baked(Path(out), record, notes + result.notes, dict(extra) if extra else None)


def bake_sweep(
    model: str | Path,
    plans: Sequence[Planned],
    out: str | Path,
    *,
    load: LoadSpec | None = None,
    force: bool = False,
    allow_zero: bool = False,
    push_to: str | None = None,
    on_each: Callable[[str, Baked], None] | None = None,
    **kwargs: Any,
) -> dict[str, Baked]:
    """Bake each plan into ``out/<label>`` (on the Hub: branch ``<label>`` of ``push_to``); from a GGUF
    MODEL into ``out/<label>.gguf`` (:func:`surgery.api.gguf_baking.sweep_gguf`).

    Every destination and every value's scales are checked before the first bake, so a taken
    destination or a refused value fails the sweep with nothing written. ``on_each(label, baked)``
    runs after each bake; ``kwargs`` go to :func:`bake_recipe`.
    """
    from ..bake.guards import check_scales
    from ..core.staging import check_container, check_free
    from ..gguf import is_gguf

    labels = [p.label for p in plans]
    if None in labels or len(set(labels)) != len(labels):
        raise RecipeError("sweep labels must be given and unique (each value gets its own folder and branch)")
    if is_gguf(model):  # one OUT/<label>.gguf per value
        from .gguf_baking import sweep_gguf

        kept = {k: kwargs[k] for k in ("allow_other_base", "requantize", "private", "stages") if k in kwargs}
        return sweep_gguf(
            Path(model),
            plans,
            Path(out),
            force=force,
            push_to=push_to,
            on_each=on_each,
            note=reporter(kwargs.get("report")),
            **kept,
        )
    load = typed(LoadSpec, kwargs, load)
    out = Path(out)
    ckpt, source = open_checkpoint(str(model), load)
    check_scales(ckpt, [p.recipe for p in plans], allow_zero=allow_zero)  # a refused value leaves no outputs
    check_container(out, [source.path])  # the sweep's folder may exist: it holds the values
    for label in labels:
        check_free(out / label, [source.path], force)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for plan in plans:
        baked = bake_recipe(
            model,
            plan.recipe,
            out / plan.label,
            load=load,
            force=force,
            allow_zero=allow_zero,
            extra=plan.extra,
            push_to=push_to,
            push_revision=plan.label if push_to else None,
            **kwargs,
        )
        results[plan.label] = baked
        if on_each is not None:
            on_each(plan.label, baked)
    return results


def bake_plans(
    model: str | Path,
    plans: Sequence[Planned],
    out: str | Path,
    *,
    on_each: Callable[[str | None, Baked], None] | None = None,
    **kwargs: Any,
) -> Baked | dict[str, Baked]:
    """One plan bakes into ``out``; several (a sweep over α or n) into ``out/<label>`` each.
    ``on_each(label, baked)`` runs after each bake."""
    if len(plans) == 1:
        baked = bake_recipe(model, plans[0].recipe, out, extra=plans[0].extra, **kwargs)
        if on_each is not None:
            on_each(plans[0].label, baked)
        return baked
    return bake_sweep(model, plans, out, on_each=on_each, **kwargs)
