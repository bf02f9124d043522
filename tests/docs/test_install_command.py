"""The install-only command the docs give: `bash examples/quickstart.sh --install-only [--torch-index URL]`.

pip is replaced by a recorder (a ``python`` in the virtual environment that logs its arguments), so
the test sees exactly the commands the script runs, with no network and no install.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.paths import REPO

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _install_only(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    venv, log = tmp_path / "venv", tmp_path / "pip.log"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    python.chmod(0o755)
    proc = subprocess.run(
        ["bash", str(REPO / "examples" / "quickstart.sh"), "--install-only", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=dict(os.environ, VENV=str(venv)),
    )
    return proc, log.read_text().splitlines() if log.exists() else []


def test_install_only_installs_torch_then_surgery_and_nothing_else(tmp_path):
    proc, calls = _install_only(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(calls) == 2 and calls[0].endswith("torch==2.13.0"), calls
    assert calls[1].endswith(f"-e {REPO}[plots]"), calls
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pip.log", "venv"]  # no output folder, no model
    assert "activate it with: . " in proc.stdout


def test_torch_index_takes_torch_alone_from_that_index(tmp_path):
    proc, calls = _install_only(tmp_path, "--torch-index", CPU_INDEX)
    assert proc.returncode == 0, proc.stderr
    assert calls[0].endswith(f"torch==2.13.0 --index-url {CPU_INDEX}"), calls
    assert "--index-url" not in calls[1]  # surgery and its other dependencies come from PyPI


def test_install_only_with_no_install_is_refused(tmp_path):
    proc, calls = _install_only(tmp_path, "--no-install")
    assert proc.returncode == 2 and "contradict" in proc.stderr and calls == []
