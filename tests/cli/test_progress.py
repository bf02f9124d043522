"""Long steps show progress on stderr in a log (stderr not a terminal), with or without --json
(which owns stdout only): each step's completion line at least, and stdout stays one JSON document.

The commands open their progress whatever --json says (surgery/cli: "stderr, with --json too"), so
one run of each with --json proves both: the log lines, and that none of them leaks into stdout. In
this process (run_here): tests/cli/test_console.py checks the lines of the real entry point."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.binding import char_model, write_small_benchmark
from tests.support.cli import cli_env, run_here
from tests.support.neuron_pairs import write_pairs

DONE = re.compile(r"^(?P<step>[^:\n]+): (?P<n>[\d,]+)/(?P=n) \(100 %\) \S+ elapsed$", re.M)


@pytest.fixture
def model(tiny):
    return char_model(tiny, "llama")


def _steps(stderr: str) -> set[str]:
    return {m["step"] for m in DONE.finditer(stderr)}


def test_every_long_step_reports_in_a_log(model, tmp_path):
    bench = write_small_benchmark(tmp_path / "small.jsonl")
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    cache = {"SURGERY_CACHE": str(tmp_path / "cache")}
    runs = {
        "score-binding": (["score-binding", model, "--benchmark", bench, "--max-pairs", "4"], {"scoring prompts"}),
        "find-neurons": (["find-neurons", model, "--pairs", pairs], {"capturing prompts"}),
        # 3 random sets cannot reach p ≤ 0.05, so the sequential stop runs one: the bar still ends
        "find-heads": (
            ["find-heads", model, "--benchmark", bench, "--max-pairs", "4", "--random-sets", "3", "--confirm", "0"],
            {"scoring prompts", "causal tests"},
        ),
        "prune-neurons": (
            ["prune-neurons", model, "--n", "2", "--pairs", pairs, "--out", tmp_path / "p"],
            {"copying", "patching", "running the source", "checking edited weights", "hashing"},
        ),
        "verify": (["verify", model, tmp_path / "p"], {"hashing", "comparing with the source", "verifying logits"}),
        "eval": (
            ["eval", tmp_path / "p", "--against", model, "--limit", "2", "--suite", "kl", "--suite", "retention"],
            None,
        ),
    }
    for name, (args, expected) in runs.items():
        proc = run_here([*args, "--json"], env=cli_env(**cache))
        assert proc.returncode == 0, proc.stderr
        steps = _steps(proc.stderr)
        if expected is None:  # eval: each measurement ends once for the source and once for the model
            done = [m["step"] for m in DONE.finditer(proc.stderr)]
            assert sorted(done) == sorted(["perplexity", "multiple choice", "KL prompts"] * 2), proc.stderr
            assert "evaluating the source" in proc.stderr
            assert all(int(pct) <= 100 for pct in re.findall(r"\((\d+) %\)", proc.stderr)), proc.stderr
        else:
            assert expected <= steps, f"{name}: {steps}"
        json.loads(proc.stdout)  # progress never leaks into stdout
