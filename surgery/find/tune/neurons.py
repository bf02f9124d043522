"""Tune prune-neurons: n, the factor, the score and the selection rule, on a measured Pareto front.

The search sees the tune split only: the effect is how much the edit lowers the bias of its
fairness pairs (neurons_eval: the mean Jensen–Shannon divergence between the next-token
distributions after a pair's two prompts), the cost the mean first-token KL on its neutral prompts.
Neurons are chosen from the findings exactly as prune-neurons chooses them (find.neurons.select).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ... import __version__
from ...core.checkpoint import Checkpoint
from ...core.edits import NeuronScale
from ...core.errors import ParameterError
from ...core.mcq import Encoded
from ...core.progress import Progress, silent
from ...model.loading import DEFAULT_LOAD, LoadSpec, load_model, load_tokenizer
from ..findings import ModelIdentity
from ..neurons.find import NeuronFindings
from ..neurons.pairs import PairSet
from ..neurons.params import RULES, SCORES, SelectParams
from ..neurons.select import allowed_mask, selected_edits
from .confirm import mean_ci
from .neurons_eval import PairTrials
from .params import TuneParams
from .record import HeldOutConfirmation, SplitSizes, TuneRecord
from .runtime import Keep, held_note, in_full_note
from .search import front_and_choice, run_search, trial_record
from .split import split_rows
from .study import study_description

OBJECTIVES = {
    "effect": "pair bias removed on the tune pairs: mean JS divergence (nats) between the next-token "
    "distributions after a pair's two prompts, unedited minus edited; higher is better (each trial "
    "also records the share of pairs whose bias grew: amplified)",
    "kl": "mean first-token KL(base ‖ edited) on the neutral tune prompts, nats, lower is better",
}


def n_range(params: TuneParams, found: NeuronFindings) -> int:
    """The most neurons a trial takes: ``n_max``, capped at the neurons prune-neurons may choose."""
    selectable = int(allowed_mask(found.scores, None, SelectParams().spare_active).sum())
    return min(params.n_max, selectable)


def suggest(trial: Any, params: TuneParams, n_max: int) -> dict[str, Any]:
    """One point of the neurons' space: n, the factor, the score and the selection rule."""
    return {
        "n": trial.suggest_int("n", 1, n_max),
        "factor": trial.suggest_float("factor", params.factor_min, params.factor_max),
        "score": trial.suggest_categorical("score", list(SCORES)),
        "rule": trial.suggest_categorical("rule", list(RULES)),
    }


def edits_of(point: dict[str, Any], found: NeuronFindings, categories: Sequence[str] | None) -> tuple[NeuronScale, ...]:
    """The run-time (and baked) edit of a point: prune-neurons' selection of ``n`` scaled by ``factor``."""
    options = SelectParams(score=point["score"], rule=point["rule"])
    selection = found.select(int(point["n"]), options, categories)
    return selected_edits(found.scores, selection, float(point["factor"]))


def amplified(base: np.ndarray, edited: np.ndarray) -> float:
    """The share of pairs whose bias the edit raised: an unsigned neuron score mixes neurons that
    carry a stereotype with neurons that hold it back, so an edit that lowers the mean can still
    make some pairs more biased (the fairness pruning paper's bidirectional effect)."""
    return float((edited > base).mean())


def describe(drawn: dict[str, Any]) -> str:
    """A drawn point of the neurons' space, for the progress line."""
    return f"n {drawn['n']}, factor {drawn['factor']:.3g}, {drawn['score']} / {drawn['rule']}"


def tune_neurons(
    ckpt: Checkpoint,
    found: NeuronFindings,
    pairs: PairSet,
    categories: Sequence[str] | None,
    params: TuneParams,
    neutral: Sequence[str],
    out: Path,
    *,
    load: LoadSpec = DEFAULT_LOAD,
    progress: Progress = silent,
    report: Callable[[str], None] = lambda m: None,
) -> TuneRecord:
    """Run (or resume) the study in ``out``, choose a point from its front, confirm it on the test split."""
    n_max = n_range(params, found)
    if n_max < 1:
        raise ParameterError("the findings leave no neuron that prune-neurons may choose; recompute them")
    by_pair = split_rows(len(pairs), params.test_share, params.seed, "pairs")
    by_text = split_rows(len(neutral), params.test_share, params.seed, "neutral prompts")
    tokenizer, model = load_tokenizer(ckpt.path, load), load_model(ckpt.path, load)
    geometry, itemsize = ModelIdentity.of(ckpt).geometry, next(model.parameters()).dtype.itemsize

    def encode(texts: Sequence[str]) -> list[Encoded]:
        return [Encoded(tuple(tokenizer(t)["input_ids"]), {}) for t in texts]

    def part(rows: Sequence[int], texts: Sequence[int], what: str) -> PairTrials:
        chosen = [pairs.pairs[i] for i in rows]
        first, second = encode([p.prompt_1 for p in chosen]), encode([p.prompt_2 for p in chosen])
        plain = encode([neutral[i] for i in texts])
        report(
            held_note(
                [*first, *second, *plain], geometry, itemsize, what, "give fewer pairs (--category)", params.keep_memory
            )
        )
        advance, keep = progress(f"baseline passes ({what})", 2 * len(chosen) + len(plain)), Keep(params.keep_memory)
        trials = PairTrials.of(model, first, second, plain, params.batch_size, advance, keep)
        if keep.in_full:
            report(in_full_note(keep, 2 * len(chosen) + len(plain), what))
        return trials

    key = {
        "tune": params.study_key(),
        "model": ckpt.model_key(),
        "pairs": pairs.sha256,
        "categories": list(categories or []),
        "neutral": neutral,
        "findings": found.data.dataset_sha256,
    }
    tune = part(by_pair.tune, by_text.tune, "tune split")
    base = float(tune.pair_base.mean())

    def measure(point: dict[str, Any]) -> tuple[float, float, dict[str, Any]]:
        bias, kl = tune.measure(edits_of(point, found, categories))
        attrs = {"pair_bias": float(bias.mean()), "amplified": amplified(tune.pair_base, bias)}
        return base - float(bias.mean()), float(kl.mean()), attrs

    def draw(trial: Any) -> dict[str, Any]:
        return suggest(trial, params, n_max)

    finished = run_search(out, key, draw, measure, params, describe, report)
    trials = [
        trial_record(
            t,
            neurons=[e.label for e in edits_of(t.params, found, categories)],
            extra={"pair_bias": t.user_attrs.get("pair_bias"), "amplified": t.user_attrs.get("amplified")},
        )
        for t in finished
    ]
    front, choice, chosen = front_and_choice(trials, params.max_kl)
    point = chosen.params
    tune = None  # the tune split's recorded passes are done with: free them before the test split's
    test = part(by_pair.test, by_text.test, "test split")
    bias, kl = test.measure(edits_of(point, found, categories))
    effect, effect_ci = mean_ci(test.pair_base - bias, params.seed)
    kl_mean, kl_ci = mean_ci(kl, params.seed)
    ids = [p.id for p in pairs.pairs]
    return TuneRecord(
        method="neurons",
        tool_version=__version__,
        model=ModelIdentity.of(ckpt),
        parameters=params.to_dict(),
        prompts={"pairs": pairs.source, "pairs_sha256": pairs.sha256, "findings": str(found.path)},
        study=study_description(params),
        objectives=OBJECTIVES,
        baseline={"pair_bias": base, "pairs": len(by_pair.tune)},
        split=SplitSizes(
            seed=params.seed,
            test_share=params.test_share,
            tune_items=[ids[i] for i in by_pair.tune],
            test_items=[ids[i] for i in by_pair.test],
            tune_pairs=len(by_pair.tune),
            test_pairs=len(by_pair.test),
            tune_neutral=len(by_text.tune),
            test_neutral=len(by_text.test),
        ),
        trials=trials,
        front=front,
        chosen=choice,
        confirmation=HeldOutConfirmation(
            effect=effect,
            effect_ci95=effect_ci,
            kl=kl_mean,
            kl_ci95=kl_ci,
            bias_base=float(test.pair_base.mean()),
            bias=float(bias.mean()),
            amplified=amplified(test.pair_base, bias),
            items=len(by_pair.test),
            neutral=len(kl),
        ),
    )
