"""Bake a recipe into a copy of a model, with every policy a bake carries — the one path the
commands and Python callers share.

:func:`bake_recipe` opens MODEL, checks the recipe against the model it is baked into
(surgery.bake.lineage: a recipe written for another model is refused unless allowed), refuses
scales that vanish or overflow in the stored dtype (surgery.bake.guards, inside the bake), runs the
bake's own check of every edited weight map (surgery.bake.check) unless told not to (and, while the
files are copied, runs the source once in transformers: surgery.bake.runnable), writes the model
card and pushes the result when asked; :class:`BakeOptions` holds these switches. :func:`bake_sweep`
bakes one output per value of a sweep (α or n), every destination and every value checked before the
first bake. :func:`check_outputs` runs those destination checks alone: the commands that find and then
bake call it first, so a taken or unwritable ``--out`` is refused before the finder's work, not after it.

A safetensors folder (or Hub id) and a GGUF file take the same path: ``open_container`` decides once
which container MODEL is (surgery/core/container.py), and the container's own methods open, check,
bake and name the outputs (surgery/bake/folder_container.py, surgery/bake/gguf_container.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from ..core.container import BakeCall, Container, open_container
from ..core.edits import Recipe
from ..core.errors import DestinationError, ParameterError, RecipeError
from ..core.evaluation_table import Evaluation
from ..core.progress import StageProgress, silent_stages
from ..gguf import is_gguf
from ..model.loading import LoadSpec
from ..model.placement import check_offload_outside
from ._common import no_other_options, reporter, typed
from .bake_options import BakeOptions, bake_options, names_bake_options
from .baked import Baked, Planned, sweep_label  # noqa: F401 (sweep_label: callers import it from here)


@names_bake_options
def bake_recipe(
    model: str | Path,
    recipe: Recipe,
    out: str | Path,
    *,
    load: LoadSpec | None = None,
    bake: BakeOptions | None = None,
    extra: Mapping[str, Any] | None = None,
    evaluation: Evaluation | Mapping[str, Any] | None = None,
    push_revision: str | None = None,
    stages: StageProgress = silent_stages,
    report: Callable[[str], None] | None = None,
    **options: Any,
) -> Baked:
    """Bake ``recipe`` into a copy of ``model`` at ``out`` (written atomically) and return what happened.

    Args:
        model: a checkpoint folder, a Hub id (``org/name``), or a GGUF file (then ``out`` is a
            .gguf file too, with two sidecars: surgery/bake/gguf.py).
        recipe: the edits; a recipe written for another model is refused unless
            ``bake.allow_other_base`` (the output then records both names).
        out: the output folder; an existing one is refused unless ``bake.force`` and it is a
            surgery output (or empty).
        bake: the bake's switches (:class:`~surgery.api.bake_options.BakeOptions`). With ``verify``
            the source runs once (one forward pass, where its weights fit in memory: a model
            transformers cannot build or run is refused) and the bake checks every edited weight
            map, before publishing. ``requantize`` (GGUF only) requantizes the blocks an edit cannot
            change exactly (Q4_0/1, Q5_0/1, Q8_0), the error measured and recorded; without it such
            an edit is refused. ``push_to`` pushes the result to that Hub repo.
        extra: entries added to surgery.json (findings summaries); ``evaluation``: rows of the card's
            before/after table.
        push_revision: the Hub branch of ``bake.push_to`` (created when missing).
        stages: progress callback ``(stage, done, total)``; ``report``: notes (default: the
            ``surgery`` logger).
        options: load options (``revision``, ``trust_remote_code``, ``device`` …: see ``LoadSpec``).
    """
    bake = bake_options("bake_recipe", bake, options)
    load = typed(LoadSpec, options, load)
    no_other_options("bake_recipe", options, LoadSpec)
    container = open_container(model)
    container.refuse(bake)
    told = dict(extra=extra, evaluation=evaluation, push_revision=push_revision, stages=stages)
    return bake_into(container, recipe, Path(out), bake=bake, load=load, note=reporter(report), **told)


def bake_into(
    container: Container,
    recipe: Recipe,
    out: Path,
    *,
    bake: BakeOptions,
    load: LoadSpec,
    extra: Mapping[str, Any] | None = None,
    evaluation: Evaluation | Mapping[str, Any] | None = None,
    push_revision: str | None = None,
    stages: StageProgress = silent_stages,
    note: Callable[[str], None] = lambda m: None,
    prepared: Any = None,
) -> Baked:
    """:func:`bake_recipe` once its options are read: the push checked first, the recipe checked
    against the model it is baked into (lineage), the container's bake, then the push.
    ``prepared``: what the container's ``prepare`` computed for this value (a sweep's)."""
    from ..bake.card import card_hook
    from ..bake.lineage import for_source

    _check_push(bake, push_revision)  # fail before a long bake, not after it
    if evaluation is not None and not isinstance(evaluation, Evaluation):
        evaluation = Evaluation.from_dict(dict(evaluation))
    opened = container.open(load)
    check_offload_outside(out, load.offload_folder)  # the source's run would make it there
    container.check_out(out, [opened.source.path], bake.force)  # before the edited weights are computed
    recipe, lineage = for_source(recipe, opened.config, opened.source, allow_other_base=bake.allow_other_base)
    notes = [lineage] if lineage else []
    if lineage:
        note(lineage)

    def noted(message: str) -> None:  # a note before the bake's own: kept with the lineage note
        notes.append(message)
        note(message)

    call = BakeCall(bake, load, dict(extra) if extra else None, card_hook(evaluation), stages, note, noted, prepared)
    result = container.bake(opened, recipe, out, call)
    record = result.provenance
    if bake.push_to:
        from ..ship.hub import push

        record = replace(record, pushed=push(out, bake.push_to, private=bake.private, revision=push_revision))
    return Baked(out, record, notes + result.notes, dict(extra) if extra else None)


@names_bake_options
def bake_sweep(
    model: str | Path,
    plans: Sequence[Planned],
    out: str | Path,
    *,
    load: LoadSpec | None = None,
    bake: BakeOptions | None = None,
    on_each: Callable[[str, Baked], None] | None = None,
    evaluation: Evaluation | Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Baked]:
    """Bake each plan into ``out/<label>`` (on the Hub: branch ``<label>`` of ``push_to``); from a GGUF
    MODEL into ``out/<label>.gguf``.

    Every destination and every value is checked before the first bake (its scales; from a GGUF its
    edited blocks, exact or refused), so a taken destination or a refused value fails the sweep with
    nothing written. ``on_each(label, baked)`` runs after each bake; ``kwargs`` go to
    :func:`bake_recipe`. With ``bake.push_to`` each value goes to the branch ``<label>`` of that repo.
    """
    from ..bake.lineage import for_source

    bake = bake_options("bake_sweep", bake, kwargs)
    labels = [p.label for p in plans]
    load = typed(LoadSpec, kwargs, load)
    stages, note = kwargs.pop("stages", silent_stages), reporter(kwargs.pop("report", None))
    no_other_options("bake_sweep", kwargs, LoadSpec)
    container = open_container(model)
    container.refuse(bake)
    out = Path(out)
    opened = container.open(load)
    outputs = _sweep_outputs(container, opened.source.path, out, labels, bake)
    recipes = [
        for_source(p.recipe, opened.config, opened.source, allow_other_base=bake.allow_other_base)[0] for p in plans
    ]
    prepared = container.prepare(opened, recipes, labels, bake)  # a refused value leaves no outputs
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for plan, ready in zip(plans, prepared, strict=True):
        baked = bake_into(
            container,
            plan.recipe,
            outputs[plan.label],
            bake=bake,
            load=load,
            extra=plan.extra,
            evaluation=evaluation,
            push_revision=plan.label if bake.push_to else None,
            stages=stages,
            note=note,
            prepared=ready,
        )
        results[plan.label] = baked
        if on_each is not None:
            on_each(plan.label, baked)
    return results


@names_bake_options
def bake_plans(
    model: str | Path,
    plans: Sequence[Planned],
    out: str | Path,
    *,
    bake: BakeOptions | None = None,
    on_each: Callable[[str | None, Baked], None] | None = None,
    **kwargs: Any,
) -> Baked | dict[str, Baked]:
    """One plan bakes into ``out``; several (a sweep over α or n) into ``out/<label>`` each.
    ``on_each(label, baked)`` runs after each bake; ``kwargs`` go to :func:`bake_recipe`."""
    bake = bake_options("bake_plans", bake, kwargs)
    if len(plans) == 1:
        baked = bake_recipe(model, plans[0].recipe, out, bake=bake, extra=plans[0].extra, **kwargs)
        if on_each is not None:
            on_each(plans[0].label, baked)
        return baked
    return bake_sweep(model, plans, out, bake=bake, on_each=on_each, **kwargs)


@names_bake_options
def refuse_load_options(load: LoadSpec, subject: str) -> None:
    """Refuse, in one line, the options of loading a model where none is loaded: ``subject`` says why
    ("x.gguf is a baked GGUF: verify recomputes its edited blocks"). Silently ignored, a ``--dtype`` or
    ``--device-map`` reads as if the work ran so."""
    default = LoadSpec()
    given = [f.name for f in fields(LoadSpec) if getattr(load, f.name) != getattr(default, f.name)]
    if given:
        raise ParameterError(
            f"{subject} and runs no model, so "
            + ", ".join(f"{{{n}}}" for n in given)
            + (" does not apply; leave it out" if len(given) == 1 else " do not apply; leave them out"),
            *given,
        )


def refuse_load_for_gguf(model: str | Path, load: LoadSpec) -> None:
    """A GGUF bake of edits the caller names (a recipe, ``--neurons``, ``--heads``) loads no model: its
    load options are refused (they apply to a GGUF only when findings are computed on its import)."""
    if is_gguf(model):
        refuse_load_options(load, f"{model} is a GGUF file: the bake computes each edited block from the file")


def check_outputs(
    model: str | Path,
    out: str | Path,
    *,
    labels: Sequence[str | None] = (None,),
    bake: BakeOptions | None = None,
    load: LoadSpec | None = None,
    push_revision: str | None = None,
    **options: Any,
) -> None:
    """Refuse, in one line and before any other work, an ``out`` that a bake of ``model`` would refuse
    only once it starts: taken (unless ``bake.force`` may replace it), inside the source, its folder
    missing or read-only, a GGUF output not named .gguf, and the push target of ``bake.push_to``.

    ``labels``: one (the default) checks ``out`` as :func:`bake_plans` bakes one plan; several check
    the sweep's folder ``out`` and each value's output in it. The bake runs the same checks again when
    it writes. A finder's run takes hours, its bake seconds: the commands that find and then bake
    (``amplify_heads``, ``prune_neurons``, ``ablate_direction``, ``tune`` with ``bake_out``) call
    this first. ``options``: load options (``revision`` …, see ``LoadSpec``).
    """
    bake = bake_options("check_outputs", bake, options)
    load = typed(LoadSpec, options, load)
    no_other_options("check_outputs", options, LoadSpec)
    container = open_container(model)
    container.refuse(bake)
    source = container.open(load).source.path
    if len(labels) == 1:
        check_offload_outside(Path(out), load.offload_folder)
        container.check_out(Path(out), [source], bake.force)
        _check_push(bake, push_revision)
    else:
        for dest in _sweep_outputs(container, source, Path(out), labels, bake).values():
            check_offload_outside(dest, load.offload_folder)


def _sweep_outputs(
    container: Container, source: Path, out: Path, labels: Sequence[str | None], bake: BakeOptions
) -> dict[str, Path]:
    """Each value's output by label, once the sweep's folder ``out`` (it may exist: it holds the
    values; it is made when missing, with its parents), every value's output and the push target
    are checked: what :func:`bake_sweep` and :func:`check_outputs` refuse before any bake."""
    from ..core.destinations import check_container, check_makeable

    if None in labels or len(set(labels)) != len(labels):
        raise RecipeError("sweep labels must be given and unique (each value gets its own folder and branch)")
    outputs = container.outputs(out, labels)
    check_container(out, [source])
    _refuse_taken_values(out, outputs, bake)
    for dest in outputs.values():
        container.check_free(dest, [source], bake.force)
    check_makeable(out, out)
    _check_push(bake, labels[0])
    return outputs


def _refuse_taken_values(out: Path, outputs: Mapping[str, Path], bake: BakeOptions) -> None:
    """Without ``bake.force``, refuse a sweep some of whose values are already baked (an earlier or
    interrupted run) in one line naming them and the rest: "alpha-2 already exists" alone would not
    say that the others are missing, nor which values finish the sweep."""
    taken = [label for label, dest in outputs.items() if dest.expanduser().exists() or dest.expanduser().is_symlink()]
    if bake.force or not taken:
        return
    missing = [label for label in outputs if label not in taken]
    rest = (
        f"; not yet baked: {', '.join(missing)} (sweep only those values to finish it)"
        if missing
        else " (every value of this sweep)"
    )
    raise DestinationError(
        f"{out} already holds {', '.join(taken)}{rest}; pass {{force}} to bake them again, or choose another {{out}}",
        "out",
        switches=("force",),
    )


def _check_push(bake: BakeOptions, revision: str | None) -> None:
    """The push target of ``bake.push_to`` (its id, a token), when the bake pushes."""
    if bake.push_to:
        from ..ship.hub import preflight

        preflight(bake.push_to, revision)
