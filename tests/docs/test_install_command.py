"""The install-only command the docs give: `bash examples/quickstart.sh --install-only [--torch-index URL]`,
and the installer it shares with `.ci/run` (examples/install.sh).

The virtual environment's ``python`` is replaced by a recorder that logs its arguments (and the uv
settings it was handed), so the test sees exactly the commands the script runs, with no network and
no install. ``UV_FAILS`` makes the recorder fail uv's own install, as on a machine that cannot fetch it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.paths import REPO

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
RECORDER = """#!/bin/sh
echo "$* | links=$UV_FIND_LINKS extra=$UV_EXTRA_INDEX_URL strategy=$UV_INDEX_STRATEGY" >> {log}
case "$*" in *"pip install"*" uv") [ -z "$UV_FAILS" ] || exit 1 ;; esac
"""


def _install_only(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    venv, log = tmp_path / "venv", tmp_path / "pip.log"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(RECORDER.format(log=log))
    python.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    proc = subprocess.run(
        ["bash", str(REPO / "examples" / "quickstart.sh"), "--install-only", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=dict(clean, VENV=str(venv), PIP_CONFIG_FILE=os.devnull, **env),
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return proc, [c for c in calls if " config " not in c]  # reading pip's settings installs nothing


def _args(call: str) -> str:
    return call.split(" | ")[0]


def test_install_only_installs_torch_then_surgery_and_nothing_else(tmp_path):
    proc, calls = _install_only(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(calls) == 4, calls
    assert _args(calls[0]).startswith("-m pip install") and _args(calls[0]).endswith(" uv"), calls
    assert _args(calls[1]).startswith("-m uv pip install") and _args(calls[1]).endswith("torch==2.13.0"), calls
    assert _args(calls[2]).endswith(f"-e {REPO}[plots]"), calls
    # bytecode written as it installs (pip does by default, uv when asked), the project's own modules too
    assert all("--compile-bytecode" in _args(c) for c in calls[1:3]), calls
    assert _args(calls[3]) == f"-m compileall -q {REPO}/surgery", calls
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pip.log", "venv"]  # no output folder, no model
    assert "activate it with: . " in proc.stdout


def test_torch_index_takes_torch_alone_from_that_index(tmp_path):
    proc, calls = _install_only(tmp_path, "--torch-index", CPU_INDEX)
    assert proc.returncode == 0, proc.stderr
    assert _args(calls[1]).endswith(f"torch==2.13.0 --index-url {CPU_INDEX}"), calls
    assert "--index-url" not in _args(calls[2])  # surgery and its other dependencies come from PyPI


def test_pip_sources_are_handed_to_uv(tmp_path):
    """A machine whose pip takes wheels from local folders and extra indexes: uv gets the same sources,
    and pip's rule of the best version over all indexes."""
    proc, calls = _install_only(
        tmp_path, PIP_FIND_LINKS="/opt/a /opt/b", PIP_EXTRA_INDEX_URL="file:///x/simple file:///y/simple"
    )
    assert proc.returncode == 0, proc.stderr
    for call in calls[1:]:
        assert "links=/opt/a,/opt/b extra=file:///x/simple file:///y/simple strategy=unsafe-best-match" in call


def test_without_uv_pip_installs_the_same(tmp_path):
    proc, calls = _install_only(tmp_path, "--torch-index", CPU_INDEX, UV_FAILS="1")
    assert proc.returncode == 0, proc.stderr
    assert "installing with pip" in proc.stderr
    assert len(calls) == 4 and all(_args(c).startswith("-m pip install") for c in calls[:3]), calls
    assert _args(calls[1]).endswith(f"torch==2.13.0 --index-url {CPU_INDEX}"), calls
    assert _args(calls[2]).endswith(f"-e {REPO}[plots]"), calls


def test_install_only_with_no_install_is_refused(tmp_path):
    proc, calls = _install_only(tmp_path, "--no-install")
    assert proc.returncode == 2 and "contradict" in proc.stderr and calls == []
