"""The study resumes: a run killed part-way and started again draws exactly the trials of an
uninterrupted run, whether the kill came inside a trial (Ctrl-C) or left one running (SIGKILL)."""

from __future__ import annotations

import pytest

from surgery.core.errors import ParameterError
from surgery.core.optional import available, install_hint
from tests.support.tune_study import KEY, draw, drawn, measure, run

pytestmark = pytest.mark.skipif(not available("optuna"), reason=install_hint("optuna"))

TRIALS = 14  # beyond TPE's 10 random start-up trials: the model-based draws are resumed too


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

    Study(tmp_path, KEY, "tpe", seed=0).close()
    with pytest.raises(ParameterError, match=r"holds a tune study of other options.*give another out"):
        Study(tmp_path, {**KEY, "model": "other"}, "tpe", seed=0)


def test_the_thread_count_does_not_key_the_study():
    from surgery.find.tune.params import TuneParams

    # the same trials on any number of threads: a study resumes on another machine's count
    assert TuneParams(threads=1).study_key() == TuneParams(threads=4).study_key() == TuneParams().study_key()


def test_the_study_file_commits_to_a_write_ahead_log(tmp_path):
    import sqlite3

    from surgery.find.tune.study import DB, Study

    study = Study(tmp_path, KEY, "tpe", seed=0)
    run(study, 2)
    # WAL: a commit appends to the log instead of waiting for the disk (33 ms a commit on a slow disk)
    with sqlite3.connect(tmp_path / DB) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert len(Study(tmp_path, KEY, "tpe", seed=0).finished()) == 2  # what it committed is there on resume


def test_a_closed_study_is_study_db_alone_and_resumes(tmp_path):
    import shutil

    from surgery.find.tune.study import DB, Study

    study = Study(tmp_path / "study", KEY, "tpe", seed=0)
    run(study, 3)
    trials = drawn(study)
    study.close()
    assert sorted(p.name for p in (tmp_path / "study").iterdir()) == [DB]  # no -wal or -shm left
    (tmp_path / "copy").mkdir()
    shutil.copy(tmp_path / "study" / DB, tmp_path / "copy" / DB)
    assert drawn(Study(tmp_path / "copy", KEY, "tpe", seed=0)) == trials  # the copy holds every trial
    resumed = Study(tmp_path / "study", KEY, "tpe", seed=0)
    run(resumed, 5)
    assert drawn(resumed)[:3] == trials and len(resumed.finished()) == 5


def test_a_refused_folder_is_left_as_study_db_alone(tmp_path):
    from surgery.find.tune.study import DB, Study

    Study(tmp_path, KEY, "tpe", seed=0).close()
    with pytest.raises(ParameterError):
        Study(tmp_path, {**KEY, "model": "other"}, "tpe", seed=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == [DB]
