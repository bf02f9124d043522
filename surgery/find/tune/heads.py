"""Tune amplify-heads: α and how many of the findings' ranked heads, on a measured Pareto front.

The search sees the tune split only: the effect is the ΔS gain on its binding pairs (the binding
contrast grown along its own sign, in S units), the cost the mean first-token KL on its neutral
prompts. Every trial runs at run time from recorded baseline passes (heads_eval); the chosen point
is then measured on the test split (confirm) and everything goes into one typed record.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ... import __version__
from ...core.checkpoint import Checkpoint
from ...core.counted import counted
from ...core.edits import HeadScale
from ...core.errors import ParameterError
from ...core.mcq import Encoded, is_instruct
from ...core.progress import Progress, silent
from ...model.loading import DEFAULT_LOAD, LoadSpec, load_model, load_tokenizer
from ..findings import ModelIdentity
from ..heads.attention import surgery_attention_on
from ..heads.find import HeadFindings, pairs_sha256
from ..heads.pairs import Pair
from ..heads.params import FindParams
from ..heads.scores import delta, encode_pairs, option_token_ids
from .confirm import gain_ci, mean_ci
from .heads_eval import HeadTrials
from .params import TuneParams
from .record import HeldOutConfirmation, SplitSizes, TuneRecord
from .runtime import Keep, held_note, in_full_note
from .search import front_and_choice, run_search, trial_record
from .split import split_groups, split_rows
from .study import study_description

OBJECTIVES = {
    "effect": "ΔS gain on the tune pairs: sign(ΔS_base)·(ΔS_edited − ΔS_base), S units, higher is better",
    "kl": "mean first-token KL(base ‖ edited) on the neutral tune prompts, nats, lower is better",
}


def head_space(params: TuneParams, found: HeadFindings) -> tuple[list[tuple[int, int]], int]:
    """The ranked heads the search draws from and the most it takes (``top_max``, default the selection's size)."""
    ranking = found.data.ranking()
    top_max = params.top_max or len(found.data.selected()) or 1
    if top_max > len(ranking):
        raise ParameterError(
            f"{{top_max}} {top_max} but the findings rank only {counted(len(ranking), 'head')}; give a smaller {{top_max}}",
            "top_max",
        )
    return ranking, top_max


def suggest(trial: Any, params: TuneParams, ranking: Sequence[tuple[int, int]], top_max: int) -> dict[str, Any]:
    """One point of the heads' space: α and the number of ranked heads."""
    return {
        "alpha": trial.suggest_float("alpha", params.alpha_min, params.alpha_max),
        "top": trial.suggest_int("top", 1, top_max),
    }


def scales_of(point: dict[str, Any], ranking: Sequence[tuple[int, int]]) -> tuple[HeadScale, ...]:
    """The run-time (and baked) edit of a point: its first ``top`` heads scaled by ``alpha``."""
    return tuple(HeadScale(layer, head, float(point["alpha"])) for layer, head in ranking[: int(point["top"])])


def _encode_neutral(tokenizer, texts: Sequence[str]) -> list[Encoded]:
    return [Encoded(tuple(tokenizer(t)["input_ids"]), {}) for t in texts]


def tune_heads(
    ckpt: Checkpoint,
    found: HeadFindings,
    pairs: Sequence[Pair],
    prompts: FindParams,
    params: TuneParams,
    neutral: Sequence[str],
    out: Path,
    *,
    load: LoadSpec = DEFAULT_LOAD,
    progress: Progress = silent,
    report: Callable[[str], None] = lambda m: None,
) -> TuneRecord:
    """Run (or resume) the study in ``out``, choose a point from its front, confirm it on the test split."""
    ranking, top_max = head_space(params, found)
    items = [p.item for p in pairs]
    by_item = split_groups(items, params.test_share, params.seed, "items")
    by_text = split_rows(len(neutral), params.test_share, params.seed, "neutral prompts")
    tokenizer, model = load_tokenizer(ckpt.path, load), load_model(ckpt.path, load)
    instruct = is_instruct(tokenizer) if prompts.instruct is None else prompts.instruct
    ids = option_token_ids(tokenizer)
    geometry, itemsize = ModelIdentity.of(ckpt).geometry, next(model.parameters()).dtype.itemsize

    def part(rows: Sequence[int], texts: Sequence[int], what: str) -> tuple[HeadTrials, list[str]]:
        chosen = [pairs[i] for i in rows]
        binding = encode_pairs(tokenizer, chosen, "binding", instruct)
        plain = _encode_neutral(tokenizer, [neutral[i] for i in texts])
        report(held_note([*binding, *plain], geometry, itemsize, what, "lower --max-pairs", params.keep_memory))
        advance, keep = progress(f"baseline passes ({what})", len(binding) + len(plain)), Keep(params.keep_memory)
        trials = HeadTrials.of(model, binding, plain, ids, params.batch_size, advance, keep)
        if keep.in_full:
            report(in_full_note(keep, len(binding) + len(plain), what))
        return trials, [p.item for p in chosen]

    key = {
        "tune": params.study_key(),
        "model": ckpt.model_key(),
        "pairs": pairs_sha256(pairs),
        "neutral": neutral,
        "ranking": [list(h) for h in ranking[:top_max]],
    }
    with surgery_attention_on(model):
        tune, tune_items = part(by_item.tune, by_text.tune, "tune split")
        n = len(tune_items)
        base = delta(tune.binding_base[:n], tune.binding_base[n:], tune_items)
        sign = -1.0 if base["delta"] < 0 else 1.0

        def measure(point: dict[str, Any]) -> tuple[float, float, dict[str, Any]]:
            s, kl = tune.measure(scales_of(point, ranking))
            d = delta(s[:n], s[n:], tune_items)["delta"]
            return sign * (d - base["delta"]), float(kl.mean()), {"delta_s": d}

        def draw(trial: Any) -> dict[str, Any]:
            return suggest(trial, params, ranking, top_max)

        finished = run_search(out, key, draw, measure, params, describe, report)
        trials = [
            trial_record(
                t, delta_s=t.user_attrs.get("delta_s"), heads=[list(h) for h in ranking[: int(t.params["top"])]]
            )
            for t in finished
        ]
        front, choice, chosen = front_and_choice(trials, params.max_kl)
        point = chosen.params
        tune = None  # the tune split's recorded passes are done with: free them before the test split's
        test, test_items = part(by_item.test, by_text.test, "test split")
        confirmation = _confirm(test, test_items, scales_of(point, ranking), params.seed)
    return TuneRecord(
        method="heads",
        tool_version=__version__,
        model=ModelIdentity.of(ckpt),
        parameters=params.to_dict(),
        prompts={"benchmark": prompts.benchmark, "pairs_sha256": pairs_sha256(pairs), "findings": str(found.path)},
        study=study_description(params),
        objectives=OBJECTIVES,
        baseline={"delta_s": base["delta"], "p": _finite(base["p"]), "pairs": n},
        split=SplitSizes(
            seed=params.seed,
            test_share=params.test_share,
            tune_items=sorted(set(tune_items)),
            test_items=sorted(set(test_items)),
            tune_pairs=len(by_item.tune),
            test_pairs=len(by_item.test),
            tune_neutral=len(by_text.tune),
            test_neutral=len(by_text.test),
        ),
        trials=trials,
        front=front,
        chosen=choice,
        confirmation=confirmation,
    )


def _confirm(test: HeadTrials, items: list[str], scales: Sequence[HeadScale], seed: int) -> HeldOutConfirmation:
    """The chosen point on the test split: ΔS gain (its sign from the test split's own ΔS) and KL, with CIs."""
    n = len(items)
    s, kl = test.measure(scales)
    base, edited = delta(test.binding_base[:n], test.binding_base[n:], items), delta(s[:n], s[n:], items)
    sign = -1.0 if base["delta"] < 0 else 1.0
    effect, effect_ci = gain_ci(test.binding_base, s, items, sign, seed)
    kl_mean, kl_ci = mean_ci(kl, seed)
    return HeldOutConfirmation(
        effect=effect,
        effect_ci95=effect_ci,
        kl=kl_mean,
        kl_ci95=kl_ci,
        delta_s_base=base["delta"],
        delta_s=edited["delta"],
        p_base=_finite(base["p"]),
        p=_finite(edited["p"]),
        items=len(set(items)),
        neutral=len(kl),
    )


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def describe(drawn: dict[str, Any]) -> str:
    """A drawn point of the heads' space, for the progress line."""
    return f"α {drawn['alpha']:.3g}, {counted(drawn['top'], 'head')}"
