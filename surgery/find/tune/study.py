"""The Optuna study of a tune, kept in SQLite in the study folder so that a killed run resumes.

Each trial is drawn by a sampler seeded with the study's seed plus the number of trials already
finished, from the finished trials alone: a run killed after k trials and resumed draws exactly the
trials an uninterrupted run draws (a trial left running by the kill is marked failed and drawn again).
The study remembers what decides its trials (the method, its options, the model, the prompts and
the findings, as one key); a folder holding a study with another key is refused, not mixed in.
Under torchrun only rank 0 opens the study (search.py hands its draws to the other ranks).
While it runs the study commits to a write-ahead log beside study.db; :meth:`Study.close` folds the
log back in, so that a finished study is study.db alone.
"""

from __future__ import annotations

import json
import sqlite3
import time
import warnings
from collections.abc import Callable, Mapping
from contextlib import closing
from functools import partial
from pathlib import Path
from typing import Any

from ...core.cache import sha256_bytes
from ...core.errors import ParameterError
from ...core.optional import require
from .params import NSGA2_POPULATION, TuneParams

STUDY_NAME = "surgery-tune"
DB = "study.db"
KEY_ATTR = "surgery_key"
# TPE's start-up trials, drawn at random whatever the finished trials hold (Optuna's default, named here
# because the search measures them together: search.py).
TPE_STARTUP = 10
# Objectives as Optuna optimises them: the effect up, the first-token KL down.
DIRECTIONS = ("maximize", "minimize")

Draw = Callable[[Any], dict[str, Any]]  # an Optuna trial → the point it draws
Measure = Callable[[dict[str, Any]], tuple[float, float, dict[str, Any]]]  # point → effect, KL, attributes
# points → (effect, KL, attributes) of each, measured together
MeasureMany = Callable[[list[dict[str, Any]]], list[tuple[float, float, dict[str, Any]]]]


def study_key(key: Mapping[str, Any]) -> str:
    """The sha256 of what decides a study's trials (its JSON, keys sorted)."""
    return sha256_bytes(json.dumps(key, sort_keys=True, default=str).encode())


def study_description(params: TuneParams) -> dict[str, Any]:
    """What the record says about a study: storage, name, sampler, seed (NSGA-II's population, and the
    trials TPE draws together)."""
    out: dict[str, Any] = {"storage": DB, "name": STUDY_NAME, "sampler": params.sampler, "seed": params.seed}
    if params.trials_at_once > 1:
        out["trials_at_once"] = params.trials_at_once
    if params.generation is not None:
        out["population"] = params.generation
    return out


def _sampler(name: str, seed: int, population: int | None, liar: bool = False):
    optuna = require("optuna")
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=population or NSGA2_POPULATION)
    with warnings.catch_warnings():  # multivariate TPE is marked experimental; it models α and the heads together
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=seed,
            multivariate=True,
            warn_independent_sampling=False,
            n_startup_trials=TPE_STARTUP,
            constant_liar=liar,  # trials drawn together: each sees the others running, not as free ground
        )


def _connect(path: str) -> sqlite3.Connection:
    """A connection to the study's SQLite file that does not wait for the disk at every write.

    Optuna commits a dozen times a trial (asked, each parameter drawn, told); with SQLite's defaults
    each commit waits for the disk to sync (33 ms here: more than a tenth of a trial). In WAL mode
    with synchronous=NORMAL a commit only appends to the log: a killed process loses nothing it
    committed, and a power cut at most the last commits, never the file's consistency.
    """
    conn = sqlite3.connect(path, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def _storage(path: Path) -> Any:
    """Optuna's SQLite storage of ``path``, through :func:`_connect`."""
    optuna = require("optuna")
    return optuna.storages.RDBStorage(f"sqlite:///{path}", engine_kwargs={"creator": partial(_connect, str(path))})


class Study:
    """A multi-objective Optuna study in ``folder``/study.db, resumable, its trials drawn reproducibly."""

    def __init__(
        self,
        folder: Path,
        key: Mapping[str, Any],
        sampler: str,
        seed: int,
        population: int | None = None,
        at_once: int = 1,
    ) -> None:
        optuna = require("optuna")
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # progress is ours: one line per trial
        folder.mkdir(parents=True, exist_ok=True)
        self.path, self.sampler, self.seed, self.population = folder / DB, sampler, seed, population
        self.at_once = at_once
        self.storage = _storage(self.path)
        self.study = optuna.create_study(
            storage=self.storage,
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
            self.close()
            raise ParameterError(
                f"{folder} holds a tune study of other options, model, prompts or findings; "
                "give another {out} or remove that folder",
                "out",
            )
        state = optuna.trial.TrialState
        for stale in self.study.get_trials(deepcopy=False, states=(state.RUNNING, state.WAITING)):
            self.study.tell(stale.number, state=state.FAIL)  # left running by a killed run

    def close(self) -> None:
        """Fold the write-ahead log into study.db and close the study: study.db then holds every trial
        alone, with no -wal or -shm file beside it (a resumed study opens the log again).

        The commands leave through ``os._exit`` (cli/leave.py), which closes no connection: without
        this the trials stay in study.db-wal, and a copy of study.db alone holds none of them.
        """
        self.storage.remove_session()
        self.storage.engine.dispose()  # every pooled connection closed: the log is ours alone to fold
        with closing(sqlite3.connect(self.path)) as conn:
            # back to a rollback journal: SQLite checkpoints the log into the file and deletes it
            conn.execute("PRAGMA journal_mode=DELETE")

    def finished(self) -> list[Any]:
        """The completed trials (Optuna's FrozenTrial), in order."""
        state = require("optuna").trial.TrialState
        return self.study.get_trials(deepcopy=False, states=(state.COMPLETE,))

    def ask(self) -> Any:
        """The next trial, drawn by a sampler seeded by the number of trials finished so far."""
        self.study.sampler = self._seeded(len(self.finished()))
        return self.study.ask()

    def _seeded(self, done: int) -> Any:
        """The sampler of the trial drawn after ``done`` finished ones."""
        return _sampler(self.sampler, self.seed + done, self.population, self.at_once > 1)

    def together(self, wanted: int) -> int:
        """How many of the next trials (at most ``wanted``) are drawn before any of them is measured:
        TPE's start-up trials not yet finished (drawn at random, whatever the finished trials hold: the
        same draws as one at a time), else ``at_once``; NSGA-II one at a time."""
        if self.sampler != "tpe":
            return 1
        return max(1, min(wanted, max(TPE_STARTUP - len(self.finished()), self.at_once)))

    def tell(self, trial: Any, values: tuple[float, float] | None, attrs: Mapping[str, Any] = {}) -> Any:
        """Record ``trial``'s objectives and attributes (``values`` None: it failed); returns it finished."""
        if values is None:
            return self.study.tell(trial, state=require("optuna").trial.TrialState.FAIL)
        for name, value in attrs.items():
            trial.set_user_attr(name, value)
        return self.study.tell(trial, list(values))

    def run_one(self, draw: Draw, measure: Measure) -> Any:
        """Draw, measure and record one trial in this process alone; returns it finished. Its seconds
        run from its ask (the sampler's work included, as Optuna's own trial times count it)."""
        start = time.perf_counter()
        trial = self.ask()
        try:
            effect, kl, attrs = measure(draw(trial))
        except BaseException:
            self.tell(trial, None)
            raise
        return self.tell(trial, (effect, kl), {**attrs, "seconds": time.perf_counter() - start})

    def run_many(self, count: int, draw: Draw, measure: MeasureMany) -> list[Any]:
        """Draw ``count`` trials (each by the sampler :meth:`ask` would give it had the ones before it
        finished: TPE's start-up trials draw the same that way), measure them together and
        record them; returns them finished, each with the batch's seconds (asks included) shared out."""
        trials, points, done = [], [], len(self.finished())
        start = time.perf_counter()
        for j in range(count):
            # the sampler is read when a trial is asked and when it draws: set for each, drawn at once
            self.study.sampler = self._seeded(done + j)
            trials.append(self.study.ask())
            points.append(draw(trials[-1]))
        try:
            results = measure(points)
        except BaseException:
            for trial in trials:
                self.tell(trial, None)
            raise
        seconds = (time.perf_counter() - start) / count
        return [
            self.tell(trial, (effect, kl), {**attrs, "seconds": seconds, "measured_with": count})
            for trial, (effect, kl, attrs) in zip(trials, results)
        ]
