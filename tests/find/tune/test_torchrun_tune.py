"""``surgery tune`` under torchrun: two ranks split every trial's prompts (gloo on CPU) and the study
is rank 0's alone, yet the record is the one process's: the same trials drawn, the same effects and
KLs, the same front, choice and held-out confirmation. Heads, neurons and direction run in one
torchrun launch (tests/support/torchrun_cli.py); the heads tune also draws with NSGA-II at a
population of its own, which tune.json records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from surgery.core.optional import available, install_hint
from tests.support.cli import cli_env, error_line, run_here
from tests.support.paths import REPO
from tests.support.planted_tune import (
    BENCHMARK,
    BIAS,
    BIAS_PAIRS,
    DIRECTION,
    DOSE,
    bias_neutral_prompts,
    neutral_prompts,
    refusal_marker,
    truth_findings,
)

pytestmark = pytest.mark.skipif(not available("optuna"), reason=install_hint("optuna"))

TRIALS = 4
POPULATION = 2
ROWS = 40  # pairs or prompts of each planted set
# Small batches: each rank gets several, so the split is exercised on every prompt set.
BATCH = ["--batch-size", "8", "--trials", str(TRIALS)]


def _head(source: Path, path: Path) -> Path:
    """The first ``ROWS`` lines of ``source``: the planted sets are larger than a two-rank check needs."""
    path.write_text("".join(source.read_text(encoding="utf-8").splitlines(keepends=True)[:ROWS]), encoding="utf-8")
    return path


def _commands(tmp: Path) -> dict[str, list]:
    """The three tunes (their --out left off): heads with NSGA-II, neurons and direction with TPE."""
    import surgery

    pairs = _head(BIAS_PAIRS, tmp / "pairs.jsonl")
    neurons = surgery.find_neurons(BIAS, pairs=str(pairs), out=tmp / "neurons.json")
    a, b = _head(DIRECTION / "a.txt", tmp / "a.txt"), _head(DIRECTION / "b.txt", tmp / "b.txt")
    direction = surgery.find_direction(DIRECTION, a=str(a), b=str(b))
    return {
        "heads": ["tune", DOSE, "--findings", truth_findings(tmp / "heads.json"), "--benchmark", BENCHMARK]
        + ["--max-pairs", "32", "--top-max", "3", "--neutral", neutral_prompts(tmp / "neutral.jsonl")]
        + ["--sampler", "nsga2", "--population", str(POPULATION), *BATCH],
        "neurons": ["tune", BIAS, "--method", "neurons", "--findings", neurons.path, "--pairs", pairs]
        + ["--neutral", bias_neutral_prompts(tmp / "bias-neutral.jsonl"), "--n-max", "12", *BATCH],
        "direction": ["tune", DIRECTION, "--method", "direction", "--findings", direction.path]
        + ["--behaviour", a, "--markers", refusal_marker(tmp / "markers.txt")]
        + ["--neutral", _head(DIRECTION / "neutral.txt", tmp / "neutral.txt"), "--max-new-tokens", "1", *BATCH],
    }


def _launch(tmp: Path, commands: dict[str, list], side: str, processes: int) -> None:
    """Run every command in one torchrun launch of ``processes`` processes, each with --out tmp/side/METHOD.

    One process is the reference: the same launcher and one thread a process, so every batch runs
    exactly as on each of the two ranks."""
    spec = [
        {"args": [str(a) for a in [*args, "--out", tmp / side / method]], "stdout": str(tmp / f"{side}-{method}.out")}
        for method, args in commands.items()
    ]
    (tmp / f"{side}.json").write_text(json.dumps(spec))
    env = cli_env(OMP_NUM_THREADS="1", SURGERY_CACHE=str(tmp / "cache"))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
    ran = subprocess.run(
        [*launcher, str(REPO / "tests" / "support" / "torchrun_cli.py"), str(tmp / f"{side}.json")],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env=env,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads((tmp / f"{side}.json.codes").read_text()) == [0] * len(commands), ran.stderr[-3000:]


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    """Per method: (the one process's tune.json, the two ranks' tune.json)."""
    tmp = tmp_path_factory.mktemp("tune-torchrun")
    commands = _commands(tmp)
    _launch(tmp, commands, "one", 1)
    _launch(tmp, commands, "two", 2)

    def read(side: str, method: str) -> dict:
        return json.loads((tmp / side / method / "tune.json").read_text())

    return {method: (read("one", method), read("two", method)) for method in commands}


@pytest.mark.parametrize("method", ["heads", "neurons", "direction"])
def test_two_ranks_record_the_one_process_tune(records, method):
    one, two = records[method]
    assert len(two["trials"]) == TRIALS
    for a, b in zip(one["trials"], two["trials"]):
        assert a["params"] == b["params"]  # rank 0 drew them; every rank measured the same point
        assert (b["effect"], b["kl"]) == (a["effect"], a["kl"])  # each batch ran as in one process
    assert two["front"] == one["front"] and two["chosen"] == one["chosen"]
    assert two["confirmation"] == one["confirmation"]
    assert two["split"] == one["split"] and two["baseline"] == one["baseline"]


def test_the_nsga2_population_is_recorded(records):
    one, two = records["heads"]
    assert two["study"]["sampler"] == "nsga2" and two["study"]["population"] == POPULATION
    assert two["parameters"]["population"] == POPULATION
    assert "population" not in records["neurons"][1]["study"]  # TPE has no generations


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--population", "4"], "Error: --population 4 is NSGA-II's generation size; give --sampler nsga2 with it"),
        (["--sampler", "nsga2", "--population", "1"], "--population"),
    ],
)
def test_a_bad_population_is_one_line(tmp_path, extra, message):
    res = run_here(["tune", DOSE, *extra], env=cli_env(SURGERY_CACHE=str(tmp_path / "cache")))
    assert message in error_line(res)
