"""Cultural binding heads from Python: score, find, amplify.

``surgery.score_binding(model)`` measures S and K on the binding benchmark (ΔS / ΔK with paired
t-tests); ``surgery.find_heads(model)`` discovers, confirms and knocks out the binding heads (cached
by the model key, pairs and parameters); ``surgery.amplify_heads(model, out, alpha=2.5)`` bakes
the found heads (or ``heads=[(7, 7)]``) scaled by α (``alpha=[2, 2.5, 3]``: one output per value).
The options are those of the commands, spelled as the fields of ``LoadSpec`` and ``FindParams``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import fields, replace
from numbers import Real
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.checkpoint import Checkpoint
from ..core.comma_list import no_repeats
from ..core.edits import HeadScale, Recipe, parse_heads
from ..core.errors import ParameterError
from ..core.progress import Progress, silent
from ..find.heads.finder import HEADS
from ..find.heads.params import RUN_ONLY, FindParams
from ..model.loading import LoadSpec, open_checkpoint
from ._common import given_path, index_pair, no_other_options, reporter, typed
from .bake_options import BakeOptions, bake_options, names_bake_options
from .baking import Baked, Planned, bake_plans, check_outputs, refuse_load_for_gguf, sweep_label
from .callbacks import Callbacks, callback_options
from .findings_source import FindingsSource

if TYPE_CHECKING:
    from ..find.heads.find import HeadFindings
    from ..find.heads.record import BindingScores


def _pairs(params: FindParams):
    """The benchmark ``params`` name and its factorial pairs."""
    from ..find.heads.benchmark import load_benchmark
    from ..find.heads.pairs import build_pairs

    bench = load_benchmark(params.benchmark)
    return bench, build_pairs(bench, seed=params.seed, per_identity=params.per_identity, max_pairs=params.max_pairs)


def score_binding(
    model: str | Path,
    *,
    load: LoadSpec | None = None,
    params: FindParams | None = None,
    progress: Progress = silent,
    **options: Any,
) -> BindingScores:
    """S and K of ``model`` on the binding benchmark: mean match / mismatch, Δ, paired t-test over
    items (``.S``, ``.K``, ``.K_over_S``; ``to_dict()`` adds the benchmark's source and sha256).
    Options: ``LoadSpec`` fields and FindParams' prompt fields (``benchmark``, ``max_pairs`` …)."""
    from ..core import distributed
    from ..find.heads.attention import surgery_attention_on
    from ..find.heads.find import pairs_sha256
    from ..find.heads.record import BindingScores
    from ..find.heads.scores import score_binding as scores
    from ..model.loadable import check_loadable
    from ..model.loading import load_model, load_tokenizer

    load, params = typed(LoadSpec, options, load), typed(FindParams, options, params)
    no_other_options("score_binding", options, LoadSpec, FindParams)
    ckpt, _ = open_checkpoint(model, load)
    check_loadable(ckpt)
    bench, pairs = _pairs(params)
    distributed.check_agree("the model and the pairs", ckpt.fingerprint(), pairs_sha256(pairs), params.to_dict())
    tok = load_tokenizer(ckpt.path, load)
    net = load_model(ckpt.path, load)
    with surgery_attention_on(net):
        res = scores(
            net,
            tok,
            pairs,
            instruct=params.instruct,
            batch_size=params.batch_size,
            progress=progress("scoring prompts", 4 * len(pairs)),
        )
    scores = BindingScores.of(res)  # the tokenizer's ids of the options are left out: not a score
    return BindingScores(
        S=scores.S,
        K=scores.K,
        K_over_S=scores.K_over_S,
        extra={"benchmark": bench.source, "benchmark_sha256": bench.sha256},
    )


def head_findings(
    model: str | Path | Checkpoint,
    *,
    source: FindingsSource | None = None,
    newest: bool = False,
    load: LoadSpec | None = None,
    params: FindParams | None = None,
    progress: Progress = silent,
    report: Callable[[str], None] | None = None,
    **options: Any,
) -> HeadFindings:
    """The head findings for ``model``: read from ``findings`` (a file; ``transfer`` accepts one of
    another checkpoint of the same architecture), else from the cache (``recompute``: computed
    again), else computed (``source``: those three, :class:`FindingsSource`). The cache key
    holds the model key (weights, tokenizer, chat template), the pairs, every parameter and the
    benchmark file's sha256. With ``newest`` (amplify-heads when no find-heads option was given) the
    newest cached findings of this model serve instead, said in one line; without any, find-heads
    runs with the default options, said up front (:func:`surgery.find.findings.unchosen_findings`)."""
    from ..find.findings import unchosen_findings
    from ..find.heads.benchmark import benchmark_awareness_records
    from ..find.heads.find import HeadFindings, cached_find_heads

    source = typed(FindingsSource, options, source)
    load, params = typed(LoadSpec, options, load), typed(FindParams, options, params)
    no_other_options("head_findings", options, FindingsSource, LoadSpec, FindParams)
    note = reporter(report)
    ckpt = model if isinstance(model, Checkpoint) else open_checkpoint(model, load)[0]
    if (found := source.read(HeadFindings, ckpt, note)) is not None:
        return found
    bench, pairs = _pairs(params)
    if newest and not source.recompute:
        # find-heads starts by saying its work (work_note): the note does not say it too
        found = unchosen_findings(HeadFindings, ckpt, None, note)
        if found is not None:
            return found
    params = replace(params, extra={"benchmark_sha256": bench.sha256})
    records = benchmark_awareness_records(bench, params.seed) if params.dose_response else None
    return cached_find_heads(
        ckpt,
        pairs,
        params,
        recompute=source.recompute,
        load=load,
        awareness_records=records,
        progress=progress,
        report=note,
    )


def find_heads(
    model: str | Path,
    *,
    recompute: bool = False,
    out: str | Path | None = None,
    progress: Progress = silent,
    report: Callable[[str], None] | None = None,
    **options: Any,
) -> HeadFindings:
    """Find the cultural binding heads of ``model``: scores, discovery, knockout confirmation,
    knockout with controls, optionally the dose-response (cached; ``recompute`` runs again);
    ``out`` also writes the findings JSON there. Options: ``LoadSpec`` and ``FindParams`` fields."""
    from ..core.destinations import check_out_file
    from ..core.distributed import is_main
    from ..find.findings import save_findings

    if out is not None:  # a folder or an unwritable one is refused now, not after the finder's run
        out = given_path(out, "out")  # ~ expanded: written where it was checked, not under ./~
        check_out_file(out, "findings.json")
    # checked here too: a typo is named as find_heads()'s, not head_findings()'s
    no_other_options("find_heads", options, FindingsSource, LoadSpec, FindParams, handed_to=head_findings)
    found = head_findings(model, recompute=recompute, progress=progress, report=report, **options)
    if out is not None and is_main():  # under torchrun rank 0 alone writes
        save_findings(found.data, Path(out))
    return found


@names_bake_options
def amplify_heads(
    model: str | Path,
    out: str | Path,
    *,
    alpha: float | Iterable[float],
    heads: str | Iterable[tuple[int, int] | str] | None = None,
    top: int | None = None,
    source: FindingsSource | None = None,
    bake: BakeOptions | None = None,
    load: LoadSpec | None = None,
    params: FindParams | None = None,
    callbacks: Callbacks | None = None,
    **options: Any,
) -> Baked | dict[str, Baked]:
    """Scale the output of chosen heads by ``alpha`` (their o_proj input columns) and write a new
    checkpoint at ``out``; a list of α bakes one folder per value into ``out``.

    The heads are ``heads`` (``"7.7,8.17"`` or ``[(7, 7), (8, 17)]``) or come from the findings (the
    knocked-out selection, or the ``top`` heads of the confirmed ranking), read from ``findings``,
    else cached: those of the find-heads options given (``params`` or its fields; computed on a
    miss), or with none given the newest cached findings of this model (find-heads runs with its
    defaults only when there are none, said up front); ``source`` (or its fields ``findings``,
    ``transfer``, ``recompute``): :class:`~surgery.api.findings_source.FindingsSource`. α = 0
    silences the heads: it needs ``bake=BakeOptions(allow_zero=True)`` (``bake``: the bake's
    switches, see :class:`~surgery.api.bake_options.BakeOptions`). ``callbacks``
    (:class:`~surgery.api.callbacks.Callbacks`): ``on_plans(plans)`` sees what will be baked
    before the first bake, ``on_each(label, baked)`` each output once written.
    """
    bake = bake_options("amplify_heads", bake, options)
    hooks = callback_options("amplify_heads", callbacks, options)
    alphas = _alphas(alpha, bake.allow_zero)
    given = sorted(name for name in HEADS.param_fields() if name in options)
    # keep_memory says how find-heads runs, not which findings it finds: alone it chooses none
    chosen_options = (params is not None and _chooses(params)) or bool(set(given) - set(RUN_ONLY))
    source = typed(FindingsSource, options, source)
    load, params = typed(LoadSpec, options, load), typed(FindParams, options, params)
    no_other_options("amplify_heads", options, FindingsSource, LoadSpec, FindParams)
    if heads is not None and (source.findings or top or source.transfer):
        raise ParameterError(
            "{heads} names the heads itself; drop {findings} / {top} / {transfer}, or drop {heads}",
            "heads",
            "findings",
            "top",
            "transfer",
        )
    if not given:  # a ready object (the command line's): the fields it sets
        default = FindParams()
        given = [f.name for f in fields(FindParams) if getattr(params, f.name) != getattr(default, f.name)]
    if heads is not None and (given or source.recompute):  # said, not silently ignored
        named = [*given, *(["recompute"] if source.recompute else [])]
        raise ParameterError(
            "{heads} names the heads itself, so no findings are read or computed; drop "
            + " / ".join(f"{{{n}}}" for n in named)
            + ", or drop {heads}",
            "heads",
            *named,
        )
    if heads is not None:
        refuse_load_for_gguf(model, load)
    labels = [sweep_label("alpha", a) for a in alphas]
    check_outputs(model, out, labels=labels, bake=bake, load=load)  # before the findings: they may take hours
    extra = None
    if heads is not None:  # an empty list is an error (parse_heads says so), not "use findings"
        chosen = _head_pairs(heads)
    else:
        found = head_findings(
            model,
            source=source,
            newest=not chosen_options,
            load=load,
            params=params,
            progress=hooks.progress,
            report=hooks.report,
        )
        chosen = found.select(top)
        extra = {"heads_findings": {**found.record(), "heads": [list(h) for h in chosen]}}
    plans = [
        Planned(
            label,
            Recipe(tuple(HeadScale(layer, head, a) for layer, head in chosen), named_by="heads" if heads else None),
            extra,
        )
        for label, a in zip(labels, alphas, strict=True)
    ]
    if hooks.on_plans is not None:
        hooks.on_plans(plans)
    return bake_plans(
        model,
        plans,
        out,
        load=load,
        bake=bake,
        stages=hooks.stages,
        report=hooks.report,
        on_each=hooks.on_each,
    )


def _chooses(params: FindParams) -> bool:
    """Whether ``params`` chooses findings: a FindParams object does, even at the defaults, unless it
    only sets how find-heads runs (keep_memory)."""
    default = FindParams()
    return params == default or params.findings_key() != default.findings_key()


def _alphas(alpha: float | Iterable[float], allow_zero: bool) -> list[float]:
    """``alpha`` as a list of distinct finite values; 0 (ablation) only with ``allow_zero``."""
    values = [alpha] if isinstance(alpha, Real) else list(alpha)  # numpy's numbers too
    if not values:
        raise ParameterError("{alpha} is empty; give one value or a list like 1.5,2,2.5", "alpha")
    if len(set(values)) != len(values):
        raise ParameterError("{alpha} lists a value twice; give each value once", "alpha")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            raise ParameterError(f"{{alpha}} must be a finite number, got {value!r}", "alpha")
        if value == 0 and not allow_zero:
            raise ParameterError(
                "{alpha} 0 does not amplify: it silences the heads entirely (ablation); "
                "pass {allow_zero} if that is what you want",
                "alpha",
                switches=("allow_zero",),
            )
    return [float(v) for v in values]


def _head_pairs(heads: str | Iterable[tuple[int, int] | str]) -> list[tuple[int, int]]:
    """Heads named as ``"7.7,8.17"``, or a list of (layer, head) pairs or such labels."""
    if isinstance(heads, str):
        return [(h.layer, h.head) for h in parse_heads(heads, 1.0)]
    pairs = []
    for item in heads:
        if isinstance(item, str):
            pairs += _head_pairs(item)
        else:
            pairs.append(index_pair(item, "heads", "(layer, head)", "[(7, 7), (8, 17)] or '7.7,8.17'"))
    if not pairs:
        raise ParameterError("{heads} is empty; give LAYER.HEAD pairs such as 7.7,8.17", "heads")
    no_repeats((f"{layer}.{head}" for layer, head in pairs), "heads", "head")  # across the list's items too
    return pairs
