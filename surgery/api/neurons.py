"""Fairness pruning from Python: find the neurons once, prune any n of them.

``surgery.find_neurons(model)`` scores every MLP neuron on contrastive demographic prompt pairs
(cached by the model key, pairs and parameters); ``surgery.prune_neurons(model, out, n=40)``
bakes the top n (``n=[20, 40]``: one output per value), or named neurons (``neurons="28:17,28:901"``).
The options are those of ``surgery find-neurons`` / ``surgery prune-neurons``, spelled as the
fields of ``LoadSpec``, ``CaptureParams`` and ``SelectParams``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from numbers import Real
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.checkpoint import Checkpoint
from ..core.comma_list import no_repeats
from ..core.counted import counted
from ..core.edits import NeuronScale, Recipe, parse_neurons
from ..core.errors import ParameterError
from ..core.progress import Progress, silent
from ..find.neurons.finder import NEURONS
from ..find.neurons.params import CaptureParams, SelectParams
from ..model.loading import LoadSpec, open_checkpoint
from ._common import given_path, index_pair, no_other_options, reporter, typed
from .bake_options import BakeOptions, bake_options, names_bake_options
from .baking import Baked, Planned, bake_plans, check_outputs, refuse_load_for_gguf, sweep_label
from .callbacks import Callbacks, callback_options
from .findings_source import FindingsSource

if TYPE_CHECKING:
    from ..find.neurons.find import NeuronFindings
    from ..find.neurons.record import NeuronSelection


def neuron_findings(
    model: str | Path | Checkpoint,
    *,
    source: FindingsSource | None = None,
    any_categories: bool = False,
    newest: bool = False,
    load: LoadSpec | None = None,
    capture: CaptureParams | None = None,
    progress: Progress = silent,
    report: Callable[[str], None] | None = None,
    **options: Any,
) -> NeuronFindings:
    """The neuron findings for ``model``: read from ``findings`` (a file; ``transfer`` accepts one of
    another checkpoint of the same architecture), else from the cache (``recompute``: computed
    again), else computed (``source``: those three, :class:`FindingsSource`).

    With ``any_categories`` (pruning), ``categories`` only select: findings over every category
    serve them, so a category-restricted capture runs only when it is already cached. With ``newest``
    (prune-neurons when no capture option was given) the newest cached findings of this model serve,
    said in one line; without any, find-neurons runs with its defaults, said up front
    (:func:`surgery.find.findings.unchosen_findings`).
    """
    from ..find.findings import unchosen_findings
    from ..find.neurons.find import NeuronFindings, cached_path
    from ..find.neurons.find import find_neurons as compute
    from ..find.neurons.pairs import load_pairs

    source = typed(FindingsSource, options, source)
    load, capture = typed(LoadSpec, options, load), typed(CaptureParams, options, capture)
    no_other_options("neuron_findings", options, FindingsSource, LoadSpec, CaptureParams)
    note = reporter(report)
    ckpt = model if isinstance(model, Checkpoint) else open_checkpoint(model, load)[0]
    recompute = source.recompute
    if source.findings is not None:
        if capture.pairs != "builtin" or capture.language or capture.strict or recompute:
            raise findings_hold_the_scores()
    if (found := source.read(NeuronFindings, ckpt, note)) is not None:
        return found
    pairs = load_pairs(capture.pairs, capture.language, capture.category_list)
    if newest and not recompute:
        work = f"{counted(len(pairs), 'pair')}: {2 * len(pairs):,} prompt forward passes"
        if (found := unchosen_findings(NeuronFindings, ckpt, work, note)) is not None:
            return found
    if any_categories and capture.categories and (recompute or not cached_path(ckpt, pairs, load).is_file()):
        pairs = load_pairs(capture.pairs, capture.language)
    return compute(
        ckpt,
        pairs,
        batch_size=capture.batch_size,
        strict=capture.strict,
        load=load,
        recompute=recompute,
        progress=progress,
        report=note,
    )


def findings_hold_the_scores() -> ParameterError:
    """Capture options beside ``findings``: they would be ignored (the file decides the pairs)."""
    return ParameterError(
        "{findings} already holds the scores; drop {pairs}/{language}/{strict}/{recompute}, "
        "or drop {findings} to compute new ones",
        "findings",
        "pairs",
        "language",
        "strict",
        "recompute",
    )


def find_neurons(
    model: str | Path,
    *,
    recompute: bool = False,
    out: str | Path | None = None,
    progress: Progress = silent,
    report: Callable[[str], None] | None = None,
    **options: Any,
) -> NeuronFindings:
    """Score every MLP neuron of ``model`` on contrastive demographic pairs (cached; ``recompute``
    captures again); ``out`` also writes the findings JSON there. Options: ``LoadSpec`` and
    ``CaptureParams`` fields (``pairs``, ``language``, ``categories``, ``batch_size``, ``device`` …)."""
    from ..core.destinations import check_out_file
    from ..core.distributed import is_main
    from ..find.neurons.find import write_findings

    if out is not None:  # a folder or an unwritable one is refused now, not after the capture
        out = given_path(out, "out")  # ~ expanded: written where it was checked, not under ./~
        check_out_file(out, "findings.json")
    # checked here too: a typo is named as find_neurons()'s, not neuron_findings()'s
    no_other_options("find_neurons", options, FindingsSource, LoadSpec, CaptureParams, handed_to=neuron_findings)
    found = neuron_findings(model, recompute=recompute, progress=progress, report=report, **options)
    if out is not None and is_main():  # under torchrun rank 0 alone writes
        write_findings(found.data, Path(out))
    return found


def neuron_summary(
    found: NeuronFindings, n: int, select: SelectParams, categories: Sequence[str] | None = None
) -> NeuronSelection:
    """The top ``n`` neurons of ``found`` under ``select`` with their evidence (rows, layer
    histogram, category overlap): what find-neurons shows and prints with --json."""
    return found.shown(n, select, categories)


def neuron_plans(
    found: NeuronFindings,
    n: int | Iterable[int],
    factor: float = 0.0,
    *,
    select: SelectParams | None = None,
    categories: Sequence[str] | None = None,
    **options: Any,
) -> list[Planned]:
    """One plan per ``n``: the top n neurons under ``select`` as a recipe with its selection record
    (labels ``n-20``, ``n-40``, …)."""
    from ..find.neurons.find import selection_record
    from ..find.neurons.select import selected_edits

    select = typed(SelectParams, options, select)
    no_other_options("neuron_plans", options, SelectParams)
    plans = []
    for count in _counts(n):
        chosen = found.select(count, select, categories)
        plans.append(
            Planned(
                sweep_label("n", count),
                Recipe(selected_edits(found.scores, chosen, factor)),
                selection_record(found, chosen, factor),
            )
        )
    return plans


@names_bake_options
def prune_neurons(
    model: str | Path,
    out: str | Path,
    *,
    n: int | Iterable[int] | None = None,
    neurons: str | Iterable[NeuronScale | str | tuple[int, int]] | None = None,
    factor: float = 0.0,
    source: FindingsSource | None = None,
    bake: BakeOptions | None = None,
    load: LoadSpec | None = None,
    capture: CaptureParams | None = None,
    select: SelectParams | None = None,
    callbacks: Callbacks | None = None,
    **options: Any,
) -> Baked | dict[str, Baked]:
    """Zero (``factor=0``) or scale MLP neurons and write a new checkpoint at ``out``.

    Give ``neurons`` (``"28:17,3:e5:17"``, or a list of labels, (layer, neuron) pairs such as
    ``[(28, 17)]`` or ``NeuronScale`` edits) or ``n``, the top n from the findings (read from
    ``findings``, else cached: those of the capture options given, or with none given the newest
    cached findings of this model; computed only when there are none; ``source``: ``findings``,
    ``transfer`` and ``recompute`` as one :class:`~surgery.api.findings_source.FindingsSource`); a
    list of n bakes one folder per value into ``out``. Returns the
    :class:`~surgery.api.baking.Baked` output, or one per label for a sweep. ``bake``: the bake's
    switches (:class:`~surgery.api.bake_options.BakeOptions`). ``callbacks``
    (:class:`~surgery.api.callbacks.Callbacks`): ``on_plans(plans)`` sees what will be baked before
    the first bake, ``on_each(label, baked)`` each output once written. Options: ``LoadSpec``,
    ``CaptureParams`` and ``SelectParams`` fields.
    """
    if not math.isfinite(factor):
        raise ParameterError(f"{{factor}} must be a finite number, got {factor}", "factor")
    if factor == 1.0:
        raise ParameterError(
            "{factor} 1 leaves every neuron unchanged; use 0 to prune or another value to scale", "factor"
        )
    if (neurons is None) == (n is None):
        raise ParameterError("give exactly one of {neurons} LAYER:INDEX,… and {n} N", "neurons", "n")
    bake = bake_options("prune_neurons", bake, options)
    hooks = callback_options("prune_neurons", callbacks, options)
    source = typed(FindingsSource, options, source)
    load = typed(LoadSpec, options, load)
    bake_kw = dict(load=load, bake=bake, stages=hooks.stages, report=hooks.report, on_each=hooks.on_each)
    if neurons is not None:
        if source.findings or source.transfer:
            raise ParameterError(
                "{neurons} names the neurons itself; drop {findings}/{transfer} or use {n}",
                "neurons",
                "findings",
                "transfer",
                "n",
            )
        _refuse_choosing(options, capture, select)
        no_other_options("prune_neurons", options, LoadSpec)
        refuse_load_for_gguf(model, load)
        edits = _neuron_edits(neurons, factor)
        check_outputs(model, out, bake=bake, load=load)
        plans = [Planned(None, Recipe(edits, named_by="neurons"))]
    else:
        chosen_options = capture is not None or any(name in options for name in NEURONS.param_fields())
        capture, select = typed(CaptureParams, options, capture), typed(SelectParams, options, select)
        no_other_options("prune_neurons", options, LoadSpec, CaptureParams, SelectParams)
        counts = _counts(n)  # before the findings: they may take a capture, as the outputs' checks are
        check_outputs(model, out, labels=[sweep_label("n", c) for c in counts], bake=bake, load=load)
        found = neuron_findings(
            model,
            source=source,
            any_categories=True,
            newest=not chosen_options,
            load=load,
            capture=capture,
            progress=hooks.progress,
            report=hooks.report,
        )
        plans = neuron_plans(found, counts, factor, select=select, categories=capture.category_list)
    if hooks.on_plans is not None:
        hooks.on_plans(plans)
    return bake_plans(model, plans, out, **bake_kw)


def _refuse_choosing(options: dict[str, Any], capture: CaptureParams | None, select: SelectParams | None) -> None:
    """Options that choose neurons from findings (``score``, ``rule`` …), given beside ``neurons``:
    they would be ignored (was: silently on the command line, "unknown option" in Python)."""
    import dataclasses

    choosing = {f.name for c in (CaptureParams, SelectParams) for f in dataclasses.fields(c)}
    given = [name for name in options if name in choosing]
    for obj in (capture, select):
        if obj is not None:
            default = type(obj)()
            given += [f.name for f in dataclasses.fields(obj) if getattr(obj, f.name) != getattr(default, f.name)]
    if given:
        names = sorted(set(given))
        raise ParameterError(
            "{neurons} names the neurons itself; "
            + ", ".join(f"{{{name}}}" for name in names)
            + (" choose" if len(names) > 1 else " chooses")
            + " neurons from findings: drop them, or give {n} instead of {neurons}",
            "neurons",
            *names,
            "n",
        )


def _counts(n: int | Iterable[int]) -> list[int]:
    """``n`` as a list of distinct whole numbers ≥ 1."""
    # numpy's numbers too; a string is one value (n="20" is not the counts 2 and 0)
    values = [n] if isinstance(n, (Real, str, bytes)) else list(n)
    bad = next((v for v in values if isinstance(v, bool) or not isinstance(v, Real) or v != int(v) or v < 1), None)
    if not values or bad is not None:
        raise ParameterError(f"{{n}} must be whole numbers ≥ 1, got {bad if values else n!r}", "n")
    if len(set(values)) != len(values):
        raise ParameterError("{n} lists a value twice; give each value once", "n")
    return [int(v) for v in values]


def _neuron_edits(
    neurons: str | Iterable[NeuronScale | str | tuple[int, int]], factor: float
) -> tuple[NeuronScale, ...]:
    """Neurons named as ``"28:17,3:e5:17"``, or a list of such labels, (layer, neuron) pairs or
    ``NeuronScale`` edits."""
    if isinstance(neurons, str):
        return tuple(parse_neurons(neurons, factor))
    edits: list[NeuronScale] = []
    for item in neurons:
        if isinstance(item, NeuronScale):
            edits.append(item)
        elif isinstance(item, str):
            edits += parse_neurons(item, factor)
        else:
            # an expert's neuron has a label only: a (layer, expert, neuron) triple is read no way
            example = "[(28, 17), (28, 901)] or '28:17,28:901'; an expert's neuron as '3:e5:17' (shared: '3:s:17')"
            layer, neuron = index_pair(item, "neurons", "(layer, neuron)", example)
            edits.append(NeuronScale(layer, neuron, factor))
    if not edits:
        raise ParameterError("{neurons} is empty; give LAYER:NEURON labels such as 28:17,28:901", "neurons")
    no_repeats((e.label for e in edits), "neurons", "neuron")  # across the list's items too
    return tuple(edits)
