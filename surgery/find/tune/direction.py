"""Tune ablate-direction: the per-layer weight kernel and the residual writers, on a measured Pareto front.

The space is the kernel heretic-llm searches, as ablate-direction spells it (find.directions.ablate):
the peak weight and its layer, the width over which the weight falls, the floor it falls to (a
share of the peak), and which residual writers are edited. The effect is how much the edit lowers
the marker rate (the share of greedy answers holding one of the user's markers) on the tune split
of the behaviour prompts; the cost the mean first-token KL on the neutral prompts, both read through
the chat template when the tokenizer has one (as heretic-llm reads its harmless prompts). Answers and
the KL's passes run with the edit hooked in at run time (model.hooks.applied), the prefix the chat
template gives every prompt computed once a batch (model.shared_prefix), and the layers below
the lowest edited one replayed from the unedited passes (evaluation.prefill).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ... import __version__
from ...core import distributed
from ...core.architectures import Architecture, architecture
from ...core.checkpoint import Checkpoint
from ...core.edits import Recipe
from ...core.progress import Progress, silent
from ...core.prompts import formatted
from ...evaluation.markers import marker_hits
from ...evaluation.prefill import Prefills, lowest_layer
from ...model.hooks import applied
from ...model.loading import DEFAULT_LOAD, LoadSpec, load_model, load_tokenizer
from ...model.shared_prefix import SharedPrefix, common_prefix, next_token_logprobs
from ..directions.ablate import direction_recipe
from ..directions.find import DirectionFindings
from ..directions.params import KernelParams
from ..findings import ModelIdentity
from .confirm import mean_ci
from .params import TuneParams
from .record import HeldOutConfirmation, SplitSizes, TuneRecord
from .runtime import first_token_kl
from .search import front_and_choice, run_search, trial_record
from .split import split_rows
from .study import study_description
from .trial_batch import TrialBatch, answers_held, batchable
from .trial_batch import next_token_logprobs as batched_logprobs

# The residual writers a trial may edit, as ablate-direction's --modules spells them.
MODULES = ("attention,mlp", "attention", "mlp")
OBJECTIVES = {
    "effect": "marker rate removed on the tune prompts: share of greedy answers holding a marker, "
    "unedited minus edited; higher is better",
    "kl": "mean first-token KL(base ‖ edited) on the neutral tune prompts (through the chat template when "
    "the tokenizer has one), nats, lower is better",
}


def suggest(trial: Any, params: TuneParams, layers: int) -> dict[str, Any]:
    """One kernel: peak weight and layer, width, floor (a share of the peak) and the writers."""
    return {
        "weight": trial.suggest_float("weight", 0.0, params.weight_max),
        "position": trial.suggest_int("position", 0, layers - 1),
        "width": trial.suggest_int("width", 1, max(1, layers - 1)),
        "floor_share": trial.suggest_float("floor_share", 0.0, 1.0),
        "modules": trial.suggest_categorical("modules", list(MODULES)),
    }


def kernel_of(point: dict[str, Any]) -> KernelParams:
    """The ablate-direction kernel of a point."""
    weight = float(point["weight"])
    return KernelParams(
        weight=weight,
        position=int(point["position"]),
        width=int(point["width"]),
        floor=weight * float(point["floor_share"]),
        modules=str(point["modules"]),
    )


def recipe_of(point: dict[str, Any], found: DirectionFindings, arch: Architecture) -> tuple[Recipe, dict[str, Any]]:
    """The run-time (and baked) edit of a point, and what surgery.json records about it."""
    return direction_recipe(found, kernel_of(point), arch)


def describe(drawn: dict[str, Any]) -> str:
    """A drawn kernel, for the progress line."""
    return (
        f"weight {drawn['weight']:.3g} at layer {drawn['position']}, width {drawn['width']}, "
        f"floor {drawn['floor_share']:.2f}×, {drawn['modules']}"
    )


class DirectionTrials:
    """The behaviour prompts and the neutral prompts of one split: the unedited marker hits and the
    neutral prompts' next-token distributions, and the unedited passes of both, kept for every trial."""

    def __init__(self, model, tokenizer, prompts: Sequence[str], neutral: Sequence[str], params: TuneParams, markers):
        self.model, self.tokenizer, self.prompts, self.markers, self.params = model, tokenizer, prompts, markers, params
        # The KL reads the neutral prompts as the model reads the behaviour prompts (and heretic-llm its
        # harmless ones): through the chat template when the tokenizer has one.
        texts, special = formatted(tokenizer, tuple(neutral), "auto")
        self.neutral = [tuple(tokenizer(t, add_special_tokens=special)["input_ids"]) for t in texts]
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        # The tokens every behaviour and neutral prompt begins with (the chat template's system turn): a
        # measure runs them once, for all its batches.
        chat, special = formatted(tokenizer, tuple(prompts), "auto")
        rows = [*self.neutral, *(tokenizer(t, add_special_tokens=special)["input_ids"] for t in chat)]
        self.prefix = tuple(rows[0][: common_prefix(rows)]) if len(rows) > 1 else ()
        self.prefills = Prefills()  # the unedited passes (recorded by the unedited measures below)
        prefix = self.shared()
        self.neutral_base = self.logprobs((), prefix)[1]
        self.base = self.hits((), prefix)

    def around(self, edits):
        """The context of each pass under ``edits``: none records the unedited pass, an edit replays it
        below its lowest layer (evaluation.prefill: the same numbers, fewer FLOPs)."""
        if edits:
            return partial(self.prefills.replaying, self.model, below=lowest_layer(self.model, edits))
        return partial(self.prefills.recording, self.model)

    def shared(self) -> SharedPrefix | None:
        """A fresh holder of the prompts' common prefix pass, for one measure's batches (one edit)."""
        return SharedPrefix(self.prefix) if self.prefix else None

    def logprobs(self, edits, prefix: SharedPrefix | None = None) -> tuple[list[int], torch.Tensor]:
        """(this rank's neutral prompts, their next-token log-softmax under ``edits``), in batches (under
        torchrun each rank computes whole batches of its own)."""
        size = self.params.batch_size
        work = distributed.Shard(range(len(self.neutral)), chunk=size)
        rows = []
        with applied(self.model, edits):
            for start in range(0, len(work.units), size):
                batch = work.units[start : start + size]
                key = ("neutral", *batch)
                rows.append(
                    next_token_logprobs(
                        self.model, [self.neutral[i] for i in batch], self.pad, key, self.around(edits), prefix
                    )
                )
        return work.mine, (torch.cat(rows) if rows else torch.empty((0, 0)))

    def hits(self, edits, prefix: SharedPrefix | None = None) -> np.ndarray:
        """Per prompt: whether its greedy answer under ``edits`` holds a marker (under torchrun each
        rank answers whole batches of its own)."""
        work = distributed.Shard(self.prompts, chunk=self.params.batch_size)
        around = self.around(edits)
        with applied(self.model, edits):
            mine = marker_hits(
                self.model,
                self.tokenizer,
                work.units,
                self.markers,
                max_new_tokens=self.params.max_new_tokens,
                batch_size=self.params.batch_size,
                around=around,
                prefix=prefix,
            )
        every = np.zeros(len(self.prompts))
        every[work.mine] = mine
        return work.gather(every)[0] > 0.5

    def measure(self, edits) -> tuple[np.ndarray, np.ndarray]:
        """(marker hits per prompt, first-token KL per neutral prompt) under ``edits``."""
        prefix = self.shared()
        mine, edited = self.logprobs(edits, prefix)
        kl = distributed.gather_rows(len(self.neutral), mine, first_token_kl(self.neutral_base, edited))
        return self.hits(edits, prefix), kl

    def measure_many(self, edit_sets: Sequence[Sequence[Any]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """:meth:`measure` of each of ``edit_sets``, all in one stacked batch where trial_batch can
        (each trial's rows under its own edit), else one after the other."""
        if not batchable(self.model, edit_sets):
            return [self.measure(edits) for edits in edit_sets]
        trials = TrialBatch(self.model, list(edit_sets), self.prefills)
        prefixes = [self.shared() for _ in edit_sets]
        size = self.params.batch_size
        # the KL's passes, batch by batch as :meth:`logprobs` runs them (the same keys: the same replays)
        work = distributed.Shard(range(len(self.neutral)), chunk=size)
        per: list[list[torch.Tensor]] = [[] for _ in edit_sets]
        for start in range(0, len(work.units), size):
            batch = work.units[start : start + size]
            rows = [self.neutral[i] for i in batch]
            for t, lp in enumerate(batched_logprobs(trials, rows, self.pad, ("neutral", *batch), prefixes)):
                per[t].append(lp)
        kls = [
            distributed.gather_rows(
                len(self.neutral),
                work.mine,
                first_token_kl(self.neutral_base, torch.cat(p) if p else torch.empty((0, 0))),
            )
            for p in per
        ]
        # the answers, batch by batch as evaluation.markers.marker_hits runs them
        prompts = distributed.Shard(self.prompts, chunk=size)
        texts, special = formatted(self.tokenizer, tuple(prompts.units), "auto")
        wanted = [m.lower() for m in self.markers]
        held: list[list[bool]] = [[] for _ in edit_sets]
        for start in range(0, len(texts), size):
            batch = texts[start : start + size]
            for t, got in enumerate(
                answers_held(trials, self.tokenizer, batch, special, wanted, self.params.max_new_tokens, prefixes)
            ):
                held[t] += got
        hits = []
        for got in held:
            every = np.zeros(len(self.prompts))
            every[prompts.mine] = np.array(got, dtype=float)
            hits.append(prompts.gather(every)[0] > 0.5)
        return list(zip(hits, kls))


def tune_direction(
    ckpt: Checkpoint,
    found: DirectionFindings,
    prompts: Sequence[str],
    markers: Sequence[str],
    params: TuneParams,
    neutral: Sequence[str],
    out: Path,
    *,
    load: LoadSpec = DEFAULT_LOAD,
    progress: Progress = silent,
    report: Callable[[str], None] = lambda m: None,
) -> TuneRecord:
    """Run (or resume) the study in ``out``, choose a point from its front, confirm it on the test split."""
    arch = architecture(ckpt.config)
    layers = len(found.layers)
    by_prompt = split_rows(len(prompts), params.test_share, params.seed, "behaviour prompts")
    by_text = split_rows(len(neutral), params.test_share, params.seed, "neutral prompts")
    tokenizer, model = load_tokenizer(ckpt.path, load), load_model(ckpt.path, load)

    def part(rows: Sequence[int], texts: Sequence[int]) -> DirectionTrials:
        return DirectionTrials(
            model, tokenizer, [prompts[i] for i in rows], [neutral[i] for i in texts], params, markers
        )

    key = {
        "tune": params.study_key(),
        "model": ckpt.model_key(),
        "prompts": list(prompts),
        "markers": list(markers),
        "neutral": list(neutral),
        "neutral_format": "chat" if getattr(tokenizer, "chat_template", None) else "plain",
        "findings": found.data.dataset_sha256,
    }
    tune = part(by_prompt.tune, by_text.tune)
    base = float(tune.base.mean())

    def measure(point: dict[str, Any]) -> tuple[float, float, dict[str, Any]]:
        recipe, _ = recipe_of(point, found, arch)
        hits, kl = tune.measure(recipe.edits)
        return base - float(hits.mean()), float(kl.mean()), {"marker_rate": float(hits.mean())}

    def measure_many(points: list[dict[str, Any]]) -> list[tuple[float, float, dict[str, Any]]]:
        measured = tune.measure_many([recipe_of(point, found, arch)[0].edits for point in points])
        return [(base - float(h.mean()), float(kl.mean()), {"marker_rate": float(h.mean())}) for h, kl in measured]

    def draw(trial: Any) -> dict[str, Any]:
        return suggest(trial, params, layers)

    finished = run_search(out, key, draw, measure, params, describe, report, measure_many)
    trials = [trial_record(t, extra={"marker_rate": t.user_attrs.get("marker_rate")}) for t in finished]
    front, choice, chosen = front_and_choice(trials, params.max_kl)
    tune = None  # the tune split's recorded passes are done with: free them before the test split's
    test = part(by_prompt.test, by_text.test)
    recipe, _ = recipe_of(chosen.params, found, arch)
    hits, kl = test.measure(recipe.edits)
    effect, effect_ci = mean_ci(test.base.astype(float) - hits, params.seed)
    kl_mean, kl_ci = mean_ci(kl, params.seed)
    return TuneRecord(
        method="direction",
        tool_version=__version__,
        model=ModelIdentity.of(ckpt),
        parameters=params.to_dict(),
        prompts={"behaviour": params.behaviour, "markers": params.markers, "findings": str(found.path)},
        study=study_description(params),
        objectives=OBJECTIVES,
        baseline={"marker_rate": base, "prompts": len(by_prompt.tune)},
        split=SplitSizes(
            seed=params.seed,
            test_share=params.test_share,
            tune_items=[str(i) for i in by_prompt.tune],
            test_items=[str(i) for i in by_prompt.test],
            tune_pairs=len(by_prompt.tune),
            test_pairs=len(by_prompt.test),
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
            rate_base=float(test.base.mean()),
            rate=float(hits.mean()),
            items=len(by_prompt.test),
            neutral=len(kl),
        ),
    )
