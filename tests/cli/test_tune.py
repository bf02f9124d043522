"""``surgery tune`` as a user runs it on the dosed planted model: the front and the held-out
confirmation printed, a line per trial with the best so far, ``--bake`` writing the chosen point
with the study in surgery.json, a second run resuming the study, and one line per bad input."""

from __future__ import annotations

import json

import pytest

from surgery.core.optional import available, install_hint
from tests.support.cli import cli_env, run_here
from tests.support.planted_tune import BENCHMARK, DOSE, dosed_head, neutral_prompts, truth_findings

pytestmark = pytest.mark.skipif(not available("optuna"), reason=install_hint("optuna"))

TRIALS = 8
ENV = cli_env(OMP_NUM_THREADS="1")


def _args(tmp, *extra) -> list:
    return [
        "tune",
        DOSE,
        "--benchmark",
        BENCHMARK,
        "--max-pairs",
        "64",
        "--batch-size",
        "64",
        "--top-max",
        "3",
        "--trials",
        str(TRIALS),
        "--neutral",
        neutral_prompts(tmp / "neutral.jsonl"),
        *extra,
    ]


def test_tune_bakes_the_chosen_point_and_records_the_study(tmp_path):
    findings = truth_findings(tmp_path / "findings.json")
    args = _args(tmp_path, "--findings", findings, "--out", tmp_path / "study")
    env = dict(ENV, SURGERY_CACHE=str(tmp_path / "cache"))
    res = run_here([*args, "--bake", tmp_path / "baked"], env=env)
    assert res.returncode == 0, res.stderr
    assert "Pareto front on the tune split" in res.stdout and "Held-out confirmation" in res.stdout
    assert "Baked 1 edit into" in res.stdout, res.stdout
    assert sum(line.startswith("note: trial ") for line in res.stderr.splitlines()) == TRIALS, res.stderr
    # where the study is kept is said before the trials, so that a run stopped midway is known to resume
    assert f"note: a new study in {tmp_path / 'study'}: stopped midway, the same command resumes it" in res.stderr
    assert "note: the tune split's baseline passes keep 60 prompts' decoder-layer inputs" in res.stderr, res.stderr

    _assert_study_db_alone(tmp_path / "study", TRIALS)
    record = json.loads((tmp_path / "study" / "tune.json").read_text())
    baked = json.loads((tmp_path / "baked" / "surgery.json").read_text())
    tune = baked["tune"]
    assert tune["seed"] == 0 and tune["trials"] == TRIALS and tune["study"]["storage"] == "study.db"
    assert tune["chosen"]["number"] == record["chosen"]["number"] and tune["confirmation"] == record["confirmation"]
    assert tune["split"]["test_pairs"] > 0 and tune["split"]["tune_pairs"] > 0
    edits = baked["recipe"]["edits"]
    assert [(e["layer"], e["head"]) for e in edits] == [dosed_head()]
    assert edits[0]["alpha"] == pytest.approx(tune["chosen"]["params"]["alpha"])

    again = run_here([*args, "--json"], env=env)
    assert again.returncode == 0, again.stderr
    assert f"resuming the study in {tmp_path / 'study'}: {TRIALS} of {TRIALS} trials done" in again.stderr
    assert not any(line.startswith("note: trial ") for line in again.stderr.splitlines())
    printed = json.loads(again.stdout)
    assert printed["trials"] == record["trials"] and printed["file"] == str(tmp_path / "study" / "tune.json")
    _assert_study_db_alone(tmp_path / "study", TRIALS)


def _assert_study_db_alone(folder, trials: int) -> None:
    """The study folder holds study.db (no write-ahead log beside it) and tune.json, and a copy of
    study.db alone holds every finished trial."""
    import shutil
    import sqlite3

    assert sorted(p.name for p in folder.iterdir()) == ["study.db", "tune.json"]
    copy = folder.parent / "copy.db"
    shutil.copy(folder / "study.db", copy)
    with sqlite3.connect(copy) as conn:
        assert conn.execute("SELECT count(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0] == trials
    copy.unlink()


def test_no_findings_for_the_method_is_one_line(tmp_path):
    res = run_here(_args(tmp_path), env=dict(ENV, SURGERY_CACHE=str(tmp_path / "cache")))
    assert res.returncode != 0 and res.stderr.strip().splitlines() == [
        f"Error: no heads findings for {DOSE}: run surgery find-heads first, or give --findings FILE"
    ], res.stderr


def test_an_empty_split_is_one_line(tmp_path):
    findings = truth_findings(tmp_path / "findings.json")
    res = run_here([*_args(tmp_path, "--findings", findings), "--test-share", "0"], env=ENV)
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0 and len(lines) == 1, res.stderr
    assert lines[0].startswith("Error: the test split is empty:") and "--test-share" in lines[0], lines


def test_a_neurons_tune_bakes_the_chosen_selection(tmp_path):
    """--method neurons on the planted bias model: the bake holds the chosen point's neurons at its
    factor, and surgery.json records the study beside the neuron selection, as prune-neurons does."""
    from tests.support.planted_tune import BIAS, BIAS_PAIRS, bias_neutral_prompts

    env = dict(ENV, SURGERY_CACHE=str(tmp_path / "cache"))
    found = run_here(["find-neurons", BIAS, "--pairs", BIAS_PAIRS, "--out", tmp_path / "findings.json"], env=env)
    assert found.returncode == 0, found.stderr
    args = ["tune", BIAS, "--method", "neurons", "--findings", tmp_path / "findings.json", "--pairs", BIAS_PAIRS]
    args += ["--neutral", bias_neutral_prompts(tmp_path / "neutral.jsonl"), "--trials", str(TRIALS), "--n-max", "12"]
    res = run_here([*args, "--out", tmp_path / "study", "--bake", tmp_path / "baked", "--no-verify"], env=env)
    assert res.returncode == 0, res.stderr
    assert "pair bias" in res.stdout and "Baked" in res.stdout, res.stdout
    record = json.loads((tmp_path / "study" / "tune.json").read_text())
    baked = json.loads((tmp_path / "baked" / "surgery.json").read_text())
    chosen = next(t for t in record["trials"] if t["number"] == record["chosen"]["number"])
    edits = baked["recipe"]["edits"]
    assert [f"{e['layer']}:{e['neuron']}" for e in edits] == chosen["neurons"]
    assert all(e["factor"] == pytest.approx(chosen["params"]["factor"]) for e in edits)
    assert baked["tune"]["chosen"]["params"] == chosen["params"] and baked["tune"]["method"] == "neurons"
    assert baked["neuron_selection"]["n"] == chosen["params"]["n"]


def test_no_neuron_findings_is_one_line(tmp_path):
    from tests.support.planted_tune import BIAS

    res = run_here(["tune", BIAS, "--method", "neurons"], env=dict(ENV, SURGERY_CACHE=str(tmp_path / "cache")))
    assert res.stderr.strip().splitlines() == [
        f"Error: no neurons findings for {BIAS}: run surgery find-neurons first, or give --findings FILE"
    ], res.stderr


def test_a_direction_tune_without_prompts_or_markers_is_one_line(tmp_path):
    from tests.support.planted_tune import DIRECTION

    res = run_here(["tune", DIRECTION, "--method", "direction"], env=dict(ENV, SURGERY_CACHE=str(tmp_path / "cache")))
    assert res.stderr.strip().splitlines() == [
        "Error: method direction measures the marker rate: give --behaviour FILE (prompts that show the "
        "behaviour) and --markers FILE (one marker a line)"
    ], res.stderr
