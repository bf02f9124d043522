"""The program ends a finished command without the interpreter's teardown, but as it would have
ended otherwise: exit code, every line of output, atexit's work done, running threads waited for."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import REPO

PROGRAM = """
import atexit, sys, threading, time
atexit.register(lambda: print("atexit ran", flush=True))
if "thread" in sys.argv[1:2]:
    def late():
        time.sleep(0.3)
        print("thread finished", flush=True)
    threading.Thread(target=late).start()
sys.argv = ["surgery", *sys.argv[2:]]
sys.stdout.write("buffered, no newline")  # flushed on the way out
from surgery.cli.main import main
main()
print("after main")  # the program's main does not return after a command that succeeded
"""


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROGRAM, *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_a_finished_command_leaves_at_once_after_atexit():
    proc = run("plain", "--version")
    assert proc.returncode == 0, proc.stderr
    assert "surgery" in proc.stdout and "buffered, no newline" in proc.stdout
    assert proc.stdout.rstrip().endswith("atexit ran")
    assert "after main" not in proc.stdout


def test_a_running_thread_is_waited_for():
    proc = run("thread", "--version")
    assert proc.returncode == 0, proc.stderr
    assert "thread finished" in proc.stdout and "atexit ran" in proc.stdout
    assert "after main" in proc.stdout  # main returned: the interpreter's exit waited for the thread


def test_a_failed_command_keeps_its_exit_code_and_message():
    proc = run("plain", "inspect", "/nonexistent/model")
    assert proc.returncode == 2 and "Error:" in proc.stderr
    assert "atexit ran" in proc.stdout


def test_in_process_main_returns():
    from surgery.cli.main import main

    main(["--version"])  # tests and benchmarks call it with arguments: it returns
