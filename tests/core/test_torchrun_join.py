"""Joining torchrun's process group: RANK and WORLD_SIZE set without the processes they promise.

A job's environment (a cluster pod, a shell where a torchrun job was debugged) may hold RANK and
WORLD_SIZE. Such a process used to wait in torch's rendezvous, in C++, deaf to Ctrl-C and SIGTERM,
for the group's 30-minute timeout, even for ``surgery --help``.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

from tests.support.cli import cli_env, error_line, run_cli, run_main
from tests.support.paths import REPO


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_0_of_2(**extra: str) -> dict[str, str]:
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "OMP_NUM_THREADS": "1"}
    return cli_env(**env, **extra)


def test_help_needs_no_process_group():
    env = _rank_0_of_2(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    for args in (["--help"], ["find-heads", "--help"]):
        res = run_cli(args, env=env, timeout=60)  # waited for rank 1 without end
        assert res.returncode == 0 and "Usage: surgery" in res.stdout, res.stderr


def test_rank_variables_without_a_rendezvous_are_one_line(monkeypatch, capsys, tmp_path):
    """MASTER_ADDR missing was "internal error (ValueError: Error initializing torch.distributed …)"."""
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    line = error_line(run_main(["score-binding", tmp_path / "absent"], capsys))
    assert "MASTER_ADDR and MASTER_PORT are not: start the command with torchrun, or unset RANK" in line


def test_a_rank_waiting_for_absent_peers_says_so_and_stops_on_ctrl_c(tmp_path):
    env = _rank_0_of_2(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), SURGERY_CACHE=str(tmp_path))
    cmd = [sys.executable, "-m", "surgery", "score-binding", str(tmp_path / "absent")]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    try:
        while not any("is waiting for the other torchrun processes" in line for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130  # was deaf to it until the group's timeout
    finally:
        proc.kill()
    reader.join(5)
    said = "".join(lines)
    assert "rank 0 of 2 is waiting" in said and "unset RANK and WORLD_SIZE" in said
    assert said.rstrip().endswith("Error: interrupted; nothing was left half-written"), said
