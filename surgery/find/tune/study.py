"""The Optuna study of a tune, kept in SQLite in the study folder so that a killed run resumes.

Each trial is drawn by a sampler seeded with the study's seed plus the number of trials already
finished, from the finished trials alone: a run killed after k trials and resumed draws exactly the
trials an uninterrupted run draws (a trial left running by the kill is marked failed and drawn again).
The study remembers what decides its trials (the method, its options, the model, the prompts and
the findings, as one key); a folder holding a study with another key is refused, not mixed in.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...core.cache import sha256_bytes
from ...core.errors import ParameterError
from ...core.optional import require

STUDY_NAME = "surgery-tune"
DB = "study.db"
KEY_ATTR = "surgery_key"
# NSGA-II's generation size: a tune's budget is tens of trials, Optuna's default (50) would leave
# every one of them to the first, random generation.
NSGA2_POPULATION = 10
# Objectives as Optuna optimises them: the effect up, the first-token KL down.
DIRECTIONS = ("maximize", "minimize")


def study_key(key: Mapping[str, Any]) -> str:
    """The sha256 of what decides a study's trials (its JSON, keys sorted)."""
    return sha256_bytes(json.dumps(key, sort_keys=True, default=str).encode())


def _sampler(name: str, seed: int):
    optuna = require("optuna")
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=NSGA2_POPULATION)
    with warnings.catch_warnings():  # multivariate TPE is marked experimental; it models α and the heads together
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, warn_independent_sampling=False)


class Study:
    """A multi-objective Optuna study in ``folder``/study.db, resumable, its trials drawn reproducibly."""

    def __init__(self, folder: Path, key: Mapping[str, Any], sampler: str, seed: int) -> None:
        optuna = require("optuna")
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # progress is ours: one line per trial
        folder.mkdir(parents=True, exist_ok=True)
        self.path, self.sampler, self.seed = folder / DB, sampler, seed
        self.study = optuna.create_study(
            storage=f"sqlite:///{self.path}",
            study_name=STUDY_NAME,
            directions=list(DIRECTIONS),
            sampler=_sampler(sampler, seed),
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

    def run_one(self, objective: Callable[[Any], tuple[float, float]]) -> Any:
        """Draw, measure and record one trial; returns it finished."""
        self.study.sampler = _sampler(self.sampler, self.seed + len(self.finished()))
        trial = self.study.ask()
        try:
            values = objective(trial)
        except BaseException:
            self.study.tell(trial, state=require("optuna").trial.TrialState.FAIL)
            raise
        return self.study.tell(trial, list(values))

    def describe(self) -> dict[str, Any]:
        """What the record says about the study: storage, name, sampler, seed."""
        return {"storage": DB, "name": STUDY_NAME, "sampler": self.sampler, "seed": self.seed}
