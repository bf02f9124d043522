"""examples/gpu_check.py runs end to end where there is no GPU: the CPU smoke run CI does.

On a GPU machine the same script measures bf16 throughput and memory at Llama-3.1-8B's shapes and
compares GPU bf16 findings with CPU float32 ones; here the bf16 side runs on the CPU, one layer deep.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.cli import cli_env
from tests.support.paths import REPO


@pytest.mark.slow(minutes=8)
def test_gpu_check_smoke_on_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    res = subprocess.run(
        [
            sys.executable,
            "examples/gpu_check.py",
            "--device",
            "cpu",
            "--layers",
            "1",
            "--pairs",
            "16",
            "--batch-size",
            "8",
            "--scratch",
            str(tmp_path / "scratch"),
            "--json",
            str(out),
        ],
        cwd=REPO,
        env=cli_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-2000:]
    assert res.stdout.strip().endswith("OK")
    result = json.loads(out.read_text())
    planted = result["planted"]
    assert planted["same_neurons"] and planted["same_heads"]
    assert len(planted["cpu float32"]["neurons"]) == 10 and planted["cpu float32"]["heads"]
    t = result["throughput"]
    assert t["capture_prompts_per_s"] > 0 and t["binding_prompts_per_s"] > 0 and t["peak_memory_gb"] > 0
