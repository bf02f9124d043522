"""The study resumes: a run killed part-way and started again draws exactly the trials of an
uninterrupted run, whether the kill came inside a trial (Ctrl-C) or left one running (SIGKILL)."""

from __future__ import annotations

import pytest

from surgery.core.errors import ParameterError
from surgery.core.optional import available, install_hint

pytestmark = pytest.mark.skipif(not available("optuna"), reason=install_hint("optuna"))

TRIALS = 14  # beyond TPE's 10 random start-up trials: the model-based draws are resumed too
KEY = {"method": "heads", "model": "m"}


def draw(trial):
    return {"alpha": trial.suggest_float("alpha", 1.0, 4.0), "top": trial.suggest_int("top", 1, 3)}


def measure(point):
    """A cheap two-objective function of the heads' space."""
    alpha, top = point["alpha"], point["top"]
    return alpha - 0.5 * top, (alpha - 1.0) ** 2 * top, {}


def drawn(study) -> list[tuple[dict, list[float]]]:
    return [(dict(t.params), list(t.values)) for t in study.finished()]


def run(study, upto: int) -> None:
    while len(study.finished()) < upto:
        study.run_one(draw, measure)


@pytest.mark.parametrize("sampler", ["tpe", "nsga2"])
def test_an_interrupted_study_resumes_with_the_same_trials(tmp_path, sampler):
    from surgery.find.tune.study import Study

    whole = Study(tmp_path / "whole", KEY, sampler, seed=3)
    run(whole, TRIALS)

    folder = tmp_path / "killed"
    first = Study(folder, KEY, sampler, seed=3)
    run(first, 5)

    def interrupted(point):
        measure(point)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        first.run_one(draw, interrupted)  # Ctrl-C inside a trial: marked failed
    Study(folder, KEY, sampler, seed=3).study.ask()  # a kill that leaves a trial running
    resumed = Study(folder, KEY, sampler, seed=3)
    run(resumed, TRIALS)
    assert drawn(resumed) == drawn(whole)
    assert len(resumed.study.trials) == TRIALS + 2  # the two lost trials are kept, as failed


def test_a_folder_of_another_study_is_refused(tmp_path):
    from surgery.find.tune.study import Study

    Study(tmp_path, KEY, "tpe", seed=0)
    with pytest.raises(ParameterError, match=r"holds a tune study of other options.*give another out"):
        Study(tmp_path, {**KEY, "model": "other"}, "tpe", seed=0)


def test_the_thread_count_does_not_key_the_study():
    from surgery.find.tune.params import TuneParams

    # the same trials on any number of threads: a study resumes on another machine's count
    assert TuneParams(threads=1).study_key() == TuneParams(threads=4).study_key() == TuneParams().study_key()
