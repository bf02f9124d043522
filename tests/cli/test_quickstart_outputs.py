"""What the README's first command leaves behind: `.ci/run` runs `bash examples/quickstart.sh` as a
new user would (a fresh clone, the virtual environment the script makes itself, an empty HOME) and
then these checks on its output folder.

Run by `.ci/run` (``pytest -m quickstart`` with ``SURGERY_QUICKSTART_OUT`` and
``SURGERY_QUICKSTART_MODEL`` set); skipped anywhere else.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from surgery.core.checkpoint import Checkpoint

pytestmark = pytest.mark.quickstart

STEPS = (
    "install",
    "get-model",
    "find-neurons",
    "prune-neurons",
    "verify-pruned",
    "eval-pruned",
    "find-heads",
    "amplify-heads",
    "verify-amplified",
    "eval-amplified",
    "export-lora",
    "report",
    "total",
)


def _env_path(name: str) -> Path:
    value = os.environ.get(name)
    if not value:
        pytest.skip(f"{name} is not set: .ci/run sets it after running the quickstart in a fresh clone")
    return Path(value)


@pytest.fixture(scope="module")
def out() -> Path:
    return _env_path("SURGERY_QUICKSTART_OUT")


@pytest.fixture(scope="module")
def model() -> Path:
    return _env_path("SURGERY_QUICKSTART_MODEL")


def test_every_step_ran_and_was_timed(out):
    lines = (out / "timings.tsv").read_text().splitlines()
    rows = [line.split("\t") for line in lines if not line.startswith("#")]
    assert rows[0] == ["step", "wall_s", "cpu_s"]
    assert lines[-1].startswith("# machine: ") and "GFLOP/s float32" in lines[-1]
    assert tuple(r[0] for r in rows[1:]) == STEPS
    assert all(float(wall) > 0 and float(cpu) >= 0 for _, wall, cpu in rows[1:])


def test_the_machine_is_recorded(out):
    """Times from different machines compare only through the machine's own matmul rate."""
    machine = json.loads((out / "machine.json").read_text())
    assert machine["cpu"] and machine["cores"] >= 1 and machine["matmul_gflops_float32"] > 0
    assert isinstance(machine["flags"], list) and machine["matmul_gflops_bfloat16"] > 0


def test_the_model_was_imported_from_the_gguf_into_the_empty_home(model):
    """The import step is the one a cached model hides: it must have run in this HOME."""
    assert (model / "surgery.gguf.json").is_file() and Checkpoint(model).config["model_type"] == "llama"


def test_baked_checkpoints_hold_their_recipes(out, model):
    for name in ("pruned", "amplified"):
        prov = json.loads((out / name / "surgery.json").read_text())
        assert prov["recipe"]["edits"], name
        assert Checkpoint(out / name).config == Checkpoint(model).config
    pruned = json.loads((out / "pruned" / "surgery.json").read_text())["recipe"]["edits"]
    assert len(pruned) == 40 and {e["type"] for e in pruned} == {"neuron"}
    amplified = json.loads((out / "amplified" / "surgery.json").read_text())["recipe"]["edits"]
    assert len(amplified) == 3 and {e["alpha"] for e in amplified} == {2.5}


def test_findings_adapter_evals_and_report(out):
    assert (out / "adapter" / "adapter_config.json").is_file()
    assert (out / "findings" / "neurons.json").is_file() and (out / "findings" / "heads.json").is_file()
    for name in ("pruned", "amplified"):
        assert json.loads((out / "eval" / f"{name}.json").read_text())["metrics"]["model"]["perplexity"] > 1
    pruned = json.loads((out / "pruned" / "surgery.json").read_text())["recipe"]["edits"]
    amplified = json.loads((out / "amplified" / "surgery.json").read_text())["recipe"]["edits"]
    # the report lists the selected neurons (a table row "| layer | neuron |") and heads
    report = (out / "report" / "report.md").read_text()
    assert all(f"| {e['layer']} | {e['neuron']} |" in report for e in pruned)
    assert "Selected heads (layer.head): " + ", ".join(f"{e['layer']}.{e['head']}" for e in amplified) in report
