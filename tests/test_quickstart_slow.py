"""The quickstart end to end on SmolLM2: every step succeeds and leaves its output in one folder.

Slow (about a quarter of an hour on 2 CPU cores) and needs the real model: ``pytest -m slow``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from surgery.checkpoint import Checkpoint

pytestmark = pytest.mark.slow(minutes=25)  # 14 min on an idle 2-core machine

REPO = Path(__file__).resolve().parents[1]
STEPS = ("get-model", "find-neurons", "prune-neurons", "verify-pruned", "eval-pruned", "find-heads",
         "amplify-heads", "verify-amplified", "eval-amplified", "export-lora", "report", "total")


def test_quickstart_smollm2(smollm2, tmp_path):
    out = tmp_path / "qs"
    env = {**os.environ, "SURGERY_MODELS": str(smollm2.parent), "SURGERY_CACHE": str(tmp_path / "cache"),
           # the `surgery` next to this interpreter, also when the virtual environment is not activated
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["bash", str(REPO / "examples" / "quickstart.sh"), "--no-install", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"Everything is in {out}" in proc.stdout

    rows = [line.split("\t") for line in (out / "timings.tsv").read_text().splitlines()]
    assert rows[0] == ["step", "wall_s", "cpu_s"]
    assert tuple(r[0] for r in rows[1:]) == STEPS
    assert all(float(wall) > 0 and float(cpu) >= 0 for _, wall, cpu in rows[1:])

    for name in ("pruned", "amplified"):
        prov = json.loads((out / name / "surgery.json").read_text())
        assert prov["recipe"]["edits"], name
        assert Checkpoint(out / name).config == Checkpoint(smollm2).config
    pruned = json.loads((out / "pruned" / "surgery.json").read_text())["recipe"]["edits"]
    assert len(pruned) == 40 and {e["type"] for e in pruned} == {"neuron"}
    amplified = json.loads((out / "amplified" / "surgery.json").read_text())["recipe"]["edits"]
    assert len(amplified) == 3 and {e["alpha"] for e in amplified} == {2.5}
    assert (out / "adapter" / "adapter_config.json").is_file()
    assert (out / "findings" / "neurons.json").is_file() and (out / "findings" / "heads.json").is_file()
    for name in ("pruned", "amplified"):
        assert json.loads((out / "eval" / f"{name}.json").read_text())["metrics"]["model"]["perplexity"] > 1
    # the report lists the selected neurons (a table row "| layer | neuron |") and heads
    report = (out / "report" / "report.md").read_text()
    assert all(f"| {e['layer']} | {e['neuron']} |" in report for e in pruned)
    assert "Selected heads (layer.head): " + ", ".join(f"{e['layer']}.{e['head']}" for e in amplified) in report
