"""Run the real ``surgery`` CLI in a subprocess (or in this process) and check what it leaves behind.

A subprocess is the honest test of the user's view: stderr exactly as a terminal gets it, the real
exit code, and no state shared with pytest; but each one imports torch and transformers again (3-10
CPU-seconds on 2 cores). ``run_here`` runs the same command in this process with the same result
shape: the tests that check a command's output and files use it, and a few keep ``run_cli`` to
check the real entry point (exit codes, start-up, signals). The other in-process runners
(``run_main``, ``main_*``) let a test watch or patch what the command does.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from tests.support.paths import REPO, TESTS

FAULT_RUNNER = TESTS / "support" / "fault_runner.py"
STAGING_TAGS = (".surgery-tmp-", ".surgery-old-", ".surgery-lock")


def cli_env(**extra: str) -> dict[str, str]:
    """The test environment plus offline Hub and no colour codes in the output."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", NO_COLOR="1", TERM="dumb", COLUMNS="200")
    env.update(extra)
    return env


def run_cli(args: Sequence[str | Path], *, timeout: float = 120, **popen) -> subprocess.CompletedProcess:
    """``python -m surgery ARGS`` with captured text output."""
    cmd = [sys.executable, "-m", "surgery", *map(str, args)]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=popen.pop("env", cli_env()), **popen
    )


def run_here(args: Sequence[str | Path], *, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """``surgery ARGS`` run in this process through ``surgery.cli.main.main``, as ``run_cli`` runs it
    in a subprocess: the same environment (``env`` replaces it for the run, as ``run_cli``'s does),
    stdout and stderr captured as text, the exit code ``main`` exits with."""
    from surgery.cli.main import main

    wanted = cli_env() if env is None else dict(env)
    saved = dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    os.environ.clear()
    os.environ.update(wanted)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                main([str(a) for a in args])
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess([str(a) for a in args], code, out.getvalue(), err.getvalue())


def faulty_cli(fault: str, args: Sequence[str | Path]) -> list[str]:
    """The command line that runs the CLI under ``tests/support/fault_runner.py`` with ``fault`` armed."""
    return [sys.executable, str(FAULT_RUNNER), fault, "--", *map(str, args)]


def error_line(result: subprocess.CompletedProcess) -> str:
    """The single ``Error: …`` line of a failed run (asserts there is exactly one, no traceback)."""
    assert result.returncode != 0, f"expected a failure, got exit 0:\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error: ")]
    assert len(errors) == 1, f"expected one 'Error: …' line, got:\n{result.stderr}"
    assert lines[-1] == errors[0], f"the error must be the last line:\n{result.stderr}"
    return errors[0]


def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (symlinks followed), keyed by relative path."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            out[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def staging_leftovers(parent: Path) -> list[str]:
    """Hidden staging entries (temporary folders, aside folders, locks) in ``parent``."""
    if not parent.is_dir():
        return []
    return sorted(
        p.name for p in parent.iterdir() if p.name.startswith(".") and any(tag in p.name for tag in STAGING_TAGS)
    )


def hidden_entries(parent: Path, before: Iterable[str] = ()) -> list[str]:
    """Hidden entries of ``parent`` that were not there ``before``."""
    if not parent.is_dir():
        return []
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".") and p.name not in set(before))


def run_main(args: Sequence[str | Path], capsys) -> subprocess.CompletedProcess:
    """The same CLI run in-process through ``surgery.cli.main.main`` (what the console script calls).

    No interpreter start-up, so a long table of cases stays fast; stdout and stderr are pytest's
    captured streams, which ``main`` and the rich consoles write to exactly as to a terminal.
    """
    from surgery.cli.main import main

    capsys.readouterr()
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out, err)


def main_code(args: Sequence[str | Path]) -> int:
    """Run ``surgery ARGS`` in this process; its exit code (the output is left to pytest's capture)."""
    from surgery.cli.main import main

    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def main_output(capsys, *args) -> tuple[int, str, str]:
    """Run ``surgery ARGS`` in this process; (exit code, stdout, stderr with rich's wrapping undone)."""
    from surgery.cli.main import main

    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, " ".join(captured.err.split())


def main_stdout(capsys, *args) -> str:
    """Run ``surgery ARGS`` in this process, which must succeed without exiting; its stdout."""
    from surgery.cli.main import main

    main([str(a) for a in args])
    return capsys.readouterr().out
