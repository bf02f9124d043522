"""Progress in logs: when stderr is not a terminal, long work still shows it is alive."""

from __future__ import annotations

from surgery.cli.console import LogLines
from tests.support.cli import cli_env, run_cli
from tests.support.paths import FIXTURES

FIXTURE = FIXTURES / "binding_model"


def test_log_lines_are_throttled_and_end_with_one_completion_line():
    now, lines = [0.0], []
    log = LogLines(lines.append, every=30, clock=lambda: now[0])
    log.begin("knockout")
    for done in range(1, 101):
        now[0] = float(done)
        log.update("knockout", done, 100)
    log.update("knockout", 100, 100)  # a repeated final update prints nothing more
    assert lines == [
        "knockout: 30/100 (30 %) 30s elapsed, ~1m10s left",
        "knockout: 60/100 (60 %) 1m00s elapsed, ~40s left",
        "knockout: 90/100 (90 %) 1m30s elapsed, ~10s left",
        "knockout: 100/100 (100 %) 1m40s elapsed",
    ]


def test_log_lines_keep_tasks_apart():
    now, lines = [0.0], []
    log = LogLines(lines.append, every=10, clock=lambda: now[0])
    log.update("copying", 0, 4)
    log.update("hashing", 0, 2)
    now[0] = 11.0
    log.update("copying", 2, 4)
    log.update("hashing", 2, 2)
    assert lines == ["copying: 2/4 (50 %) 11s elapsed, ~11s left", "hashing: 2/2 (100 %) 11s elapsed"]


def test_cli_writes_progress_lines_when_stderr_is_a_file(tmp_path):
    """A bake run with stderr captured (not a terminal) prints one plain line per finished stage."""
    res = run_cli(["amplify-heads", FIXTURE, "--heads", "0.3", "--alpha", "2", "--out", tmp_path / "out"])
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    for stage in ("copying", "patching", "checking edited weights", "hashing"):
        assert any(line.startswith(f"{stage}: ") and "(100 %)" in line for line in lines), res.stderr
    assert "\x1b[" not in res.stderr  # no cursor or colour codes in a log


def test_notes_stay_one_line_in_a_log():
    """rich wraps at 80 columns when stderr is not a terminal; a note in a log must stay one line."""
    import subprocess
    import sys

    note = " ".join(["word"] * 60)
    res = subprocess.run(
        [sys.executable, "-c", f"from surgery.cli.console import err; err.print('note: {note}')"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in cli_env().items() if k != "COLUMNS"},
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == [f"note: {note}"]
