"""The Optuna study of a tune, kept in SQLite in the study folder so that a killed run resumes.

Each trial is drawn by a sampler seeded with the study's seed plus the number of trials already
finished, from the finished trials alone: a run killed after k trials and resumed draws exactly the
trials an uninterrupted run draws (a trial left running by the kill is marked failed and drawn again).
The study remembers what decides its trials (the method, its options, the model, the prompts and
the findings, as one key); a folder holding a study with another key is refused, not mixed in.
Under torchrun only rank 0 opens the study (search.py hands its draws to the other ranks).
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...core.cache import sha256_bytes
from ...core.errors import ParameterError
from ...core.optional import require
from .params import NSGA2_POPULATION, TuneParams

STUDY_NAME = "surgery-tune"
DB = "study.db"
KEY_ATTR = "surgery_key"
# Objectives as Optuna optimises them: the effect up, the first-token KL down.
DIRECTIONS = ("maximize", "minimize")

Draw = Callable[[Any], dict[str, Any]]  # an Optuna trial → the point it draws
Measure = Callable[[dict[str, Any]], tuple[float, float, dict[str, Any]]]  # point → effect, KL, attributes


def study_key(key: Mapping[str, Any]) -> str:
    """The sha256 of what decides a study's trials (its JSON, keys sorted)."""
    return sha256_bytes(json.dumps(key, sort_keys=True, default=str).encode())


def study_description(params: TuneParams) -> dict[str, Any]:
    """What the record says about a study: storage, name, sampler, seed (and NSGA-II's population)."""
    out: dict[str, Any] = {"storage": DB, "name": STUDY_NAME, "sampler": params.sampler, "seed": params.seed}
    if params.generation is not None:
        out["population"] = params.generation
    return out


def _sampler(name: str, seed: int, population: int | None):
    optuna = require("optuna")
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=population or NSGA2_POPULATION)
    with warnings.catch_warnings():  # multivariate TPE is marked experimental; it models α and the heads together
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, warn_independent_sampling=False)


class Study:
    """A multi-objective Optuna study in ``folder``/study.db, resumable, its trials drawn reproducibly."""

    def __init__(
        self, folder: Path, key: Mapping[str, Any], sampler: str, seed: int, population: int | None = None
    ) -> None:
        optuna = require("optuna")
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # progress is ours: one line per trial
        folder.mkdir(parents=True, exist_ok=True)
        self.path, self.sampler, self.seed, self.population = folder / DB, sampler, seed, population
        self.study = optuna.create_study(
            storage=f"sqlite:///{self.path}",
            study_name=STUDY_NAME,
            directions=list(DIRECTIONS),
            sampler=_sampler(sampler, seed, population),
            load_if_exists=True,
        )
        digest = study_key(key)
        known = self.study.user_attrs.get(KEY_ATTR)
        if known is None:
            self.study.set_user_attr(KEY_ATTR, digest)
        elif known != digest:
            raise ParameterError(
                f"{folder} holds a tune study of other options, model, prompts or findings; "
                "give another {out} or remove that folder",
                "out",
            )
        state = optuna.trial.TrialState
        for stale in self.study.get_trials(deepcopy=False, states=(state.RUNNING, state.WAITING)):
            self.study.tell(stale.number, state=state.FAIL)  # left running by a killed run

    def finished(self) -> list[Any]:
        """The completed trials (Optuna's FrozenTrial), in order."""
        state = require("optuna").trial.TrialState
        return self.study.get_trials(deepcopy=False, states=(state.COMPLETE,))

    def ask(self) -> Any:
        """The next trial, drawn by a sampler seeded by the number of trials finished so far."""
        self.study.sampler = _sampler(self.sampler, self.seed + len(self.finished()), self.population)
        return self.study.ask()

    def tell(self, trial: Any, values: tuple[float, float] | None, attrs: Mapping[str, Any] = {}) -> Any:
        """Record ``trial``'s objectives and attributes (``values`` None: it failed); returns it finished."""
        if values is None:
            return self.study.tell(trial, state=require("optuna").trial.TrialState.FAIL)
        for name, value in attrs.items():
            trial.set_user_attr(name, value)
        return self.study.tell(trial, list(values))

    def run_one(self, draw: Draw, measure: Measure) -> Any:
        """Draw, measure and record one trial in this process alone; returns it finished."""
        trial = self.ask()
        start = time.perf_counter()
        try:
            effect, kl, attrs = measure(draw(trial))
        except BaseException:
            self.tell(trial, None)
            raise
        return self.tell(trial, (effect, kl), {**attrs, "seconds": time.perf_counter() - start})
