"""Tune an edit from Python: a multi-objective search over its parameters, confirmed on held-out prompts.

``surgery.tune(model, method="heads", findings="findings.json", trials=40)`` searches α and how many
of the findings' ranked heads to scale (Optuna, a SQLite study in ``out`` that a killed run resumes),
measuring each trial at run time: the ΔS gain on the tune split's binding pairs against the
first-token KL on neutral prompts. ``method="neurons"`` searches prune-neurons' n, factor, score and
selection rule against the bias of the fairness pairs (how differently the model continues a
pair's two prompts). It picks the front's best point within ``max_kl`` (or the knee),
re-measures it on the test split with 95% CIs, writes ``tune.json`` and, with ``bake_out``, bakes
the chosen point through the usual bake (its surgery.json records the study). Under torchrun the
prompts of every trial are split across the ranks; rank 0 alone keeps the study, writes and bakes. The options are those
of ``surgery tune``, spelled as the fields of ``LoadSpec``, ``TuneParams`` and ``FindParams``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core import distributed
from ..core.cache import cache_dir
from ..core.errors import ParameterError
from ..core.progress import Progress, StageProgress, silent, silent_stages
from ..find.heads.params import FindParams
from ..find.neurons.params import CaptureParams
from ..find.tune.params import TuneParams, refuse_other_methods
from ..model.loading import LoadSpec, open_checkpoint
from ._common import given_path, no_other_options, reporter, typed
from .bake_options import BakeOptions, bake_options, names_bake_options
from .baked import Baked

if TYPE_CHECKING:
    from ..find.tune.record import TuneRecord


@dataclass
class Tuned:
    """A finished tune: its record, where it was written, and the bake of the chosen point (if asked)."""

    record: TuneRecord
    path: Path
    baked: Baked | None = None


def default_folder(model_key: str, params: TuneParams, prompts: dict[str, Any]) -> Path:
    """The study folder when none is given: under the cache, by model, method and options (``prompts``:
    the options that choose the prompts), so that the same command run again resumes the same study."""
    from ..core.cache import params_key

    key = params_key({**params.study_key(), **prompts})
    return cache_dir() / "tune" / f"{model_key[:16]}-{params.method}-{key}"


# The binding pairs' fields the tune takes from its own TuneParams (one seed for the split and the
# sampler, one batch size and one bound on kept baseline passes for every trial): prompts' are not read.
TUNE_OWNED = ("seed", "batch_size", "keep_memory")


def _refuse_tune_owned(prompts: FindParams, params: TuneParams) -> None:
    """A value of ``prompts`` in :data:`TUNE_OWNED` that is neither FindParams' default nor the tune's
    would be dropped without a word: refuse it in one line naming where it goes."""
    default = FindParams()
    stray = [
        name for name in TUNE_OWNED if getattr(prompts, name) not in (getattr(default, name), getattr(params, name))
    ]
    if stray:
        given = ", ".join(f"{name}={getattr(prompts, name)!r}" for name in stray)
        raise ParameterError(
            f"{{prompts}}' {', '.join(stray)} {'is' if len(stray) == 1 else 'are'} not read: the tune uses its own; "
            f"give params=TuneParams({given}) (or {given} as {'a keyword' if len(stray) == 1 else 'keywords'}) and leave {'it' if len(stray) == 1 else 'them'} "
            "out of prompts",
            "prompts",
        )


@names_bake_options
def tune(
    model: str | Path,
    *,
    findings: str | Path | None = None,
    out: str | Path | None = None,
    bake_out: str | Path | None = None,
    bake: BakeOptions | None = None,
    load: LoadSpec | None = None,
    params: TuneParams | None = None,
    prompts: FindParams | None = None,
    capture: CaptureParams | None = None,
    progress: Progress = silent,
    stages: StageProgress = silent_stages,
    report: Callable[[str], None] | None = None,
    **options: Any,
) -> Tuned:
    """Tune ``params.method``'s edit of ``model`` and return the record (also written to ``out``/tune.json).

    ``findings``: the findings file of the method (default: the newest cached findings of this
    model). ``out``: the study folder (default: under the cache, keyed by the options); running
    again resumes its study. ``bake_out``: bake the chosen point there (``bake``: the bake's
    switches). The prompts: for heads the binding pairs of ``prompts`` (benchmark, max_pairs …;
    their seed and batch size are the tune's), for neurons the fairness pairs of ``capture``
    (pairs, language, categories). Options: fields of ``LoadSpec``, ``TuneParams``, ``FindParams``
    and ``CaptureParams``.
    """
    from ..core.optional import require
    from ..find.tune.neutral import neutral_texts
    from ..find.tune.record import FILE, save_record

    require("optuna")  # before any model is read: a missing package is the one-line pip hint
    bake = bake_options("tune", bake, options)
    load, params = typed(LoadSpec, options, load), typed(TuneParams, options, params)
    prompts, capture = typed(FindParams, options, prompts), typed(CaptureParams, options, capture)
    no_other_options("tune", options, LoadSpec, TuneParams, FindParams, CaptureParams)
    # the binding pairs' options are the heads' alone, the fairness pairs' the neurons'
    refuse_other_methods(params.method, prompts, {"heads": ("benchmark", "max_pairs", "per_identity", "instruct")})
    refuse_other_methods(params.method, capture, {"neurons": ("pairs", "language", "categories")})
    _refuse_tune_owned(prompts, params)
    prompts = replace(prompts, seed=params.seed, batch_size=params.batch_size)
    if params.method == "direction" and (params.behaviour is None or params.markers is None):
        raise ParameterError(
            "method direction measures the marker rate: give {behaviour} FILE (prompts that show the "
            "behaviour) and {markers} FILE (one marker a line)",
            "behaviour",
            "markers",
        )
    if bake_out is not None:  # the study takes hours, its bake seconds: a taken folder is refused now
        from .baking import check_outputs

        check_outputs(model, bake_out, bake=bake, load=load)
    note = reporter(report)
    from ..model.threads import threads

    # many short passes of a few rows: on busy cores a thread per core waits on its slowest one
    with threads(params.threads):
        ckpt, _ = open_checkpoint(model, load)
        found = _findings(params.method, ckpt, model, findings, note)
        texts = neutral_texts(params.neutral)
        key = prompts.findings_key() if params.method == "heads" else asdict(capture)
        folder = given_path(out, "out") if out is not None else default_folder(ckpt.model_key(), params, key)
        if params.method == "heads":
            from ..find.tune.heads import tune_heads
            from .heads import _pairs

            _, pairs = _pairs(prompts)
            record = tune_heads(
                ckpt, found, pairs, prompts, params, texts, folder, load=load, progress=progress, report=note
            )
        elif params.method == "neurons":
            from ..find.neurons.pairs import load_pairs
            from ..find.tune.neurons import tune_neurons

            pair_set = load_pairs(capture.pairs, capture.language, capture.category_list)
            record = tune_neurons(
                ckpt,
                found,
                pair_set,
                capture.category_list,
                params,
                texts,
                folder,
                load=load,
                progress=progress,
                report=note,
            )
        else:
            from ..core.prompts import read_prompts
            from ..evaluation.markers import read_markers
            from ..find.tune.direction import tune_direction

            behaviour = read_prompts(params.behaviour, "behaviour").prompts
            record = tune_direction(
                ckpt,
                found,
                behaviour,
                read_markers(params.markers),
                params,
                texts,
                folder,
                load=load,
                progress=progress,
                report=note,
            )
        path = folder / FILE
        if not distributed.is_main():
            return Tuned(record, path)  # under torchrun rank 0 alone writes the record and bakes
        save_record(record, path)
        baked = None
        if bake_out is not None:
            recipe, extra = _chosen_recipe(record, found, capture, ckpt)
            from .baking import bake_recipe

            baked = bake_recipe(model, recipe, bake_out, load=load, bake=bake, extra=extra, stages=stages, report=note)
        return Tuned(record, path, baked)


def _findings(method: str, ckpt, model, findings: str | Path | None, note: Callable[[str], None]):
    """The method's findings: ``findings`` (a file), else the newest cached of this model, else a one-line error."""
    from ..find.directions.find import DirectionFindings
    from ..find.findings import newest_cached
    from ..find.heads.find import HeadFindings
    from ..find.neurons.find import NeuronFindings

    kind = {"heads": HeadFindings, "neurons": NeuronFindings, "direction": DirectionFindings}[method]
    if findings is not None:
        return kind.read(findings, ckpt, False)
    from ..find.finders import finder

    found = newest_cached(kind, ckpt)
    if found is None:
        raise ParameterError(
            f"no {method} findings for {model}: run surgery {finder(kind.kind).find_command} first, or give {{findings}} FILE",
            "findings",
        )
    note(f"tuning with the newest cached {method} findings: {found.path}")
    return found


def _chosen_recipe(record: TuneRecord, found, capture: CaptureParams, ckpt) -> tuple[Any, dict[str, Any]]:
    """The chosen point's recipe and what its surgery.json records: the study and the findings."""
    from ..core.edits import HeadScale, Recipe
    from ..find.neurons.find import selection_record
    from ..find.neurons.params import SelectParams
    from ..find.neurons.select import selected_edits

    chosen = record.trial(record.chosen.number)
    if record.method == "direction":
        from ..core.architectures import architecture
        from ..find.tune.direction import recipe_of

        recipe, kernel = recipe_of(chosen.params, found, architecture(ckpt.config))
        return recipe, {"tune": record.summary(), **kernel}
    if record.method == "heads":
        heads = [tuple(h) for h in chosen.heads or []]
        recipe = Recipe(tuple(HeadScale(layer, head, float(chosen.params["alpha"])) for layer, head in heads))
        return recipe, {
            "tune": record.summary(),
            "heads_findings": {**found.record(), "heads": [list(h) for h in heads]},
        }
    point = chosen.params
    selection = found.select(
        int(point["n"]), SelectParams(score=point["score"], rule=point["rule"]), capture.category_list
    )
    factor = float(point["factor"])
    recipe = Recipe(selected_edits(found.scores, selection, factor))
    return recipe, {"tune": record.summary(), **selection_record(found, selection, factor)}
