"""The ``surgery`` entry point: runs the click group; every error becomes one ``Error: …`` line."""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, redirect_stderr, redirect_stdout

import click

from ..core import distributed
from ..core.errors import SurgeryError
from ..core.progress import Aside, reporting_aside
from .group import cli

# The commands that split their work across torchrun's processes; any other refuses (N bakes into
# one folder would race). Which commands run data-parallel is the command line's decision: the
# library's loops split themselves wherever they run (surgery.core.distributed.Shard).
DATA_PARALLEL = ("find-neurons", "find-heads", "score-binding", "eval", "find-direction", "tune")


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


def _for_the_command_line(exc: SurgeryError) -> str:
    """A library error names its parameters; the command line's user knows them as flags."""
    if not exc.names:
        return str(exc)
    from .options import flag_of  # imported here: a partial install must still reach its one line

    return exc.spelled(flag_of)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def _sigterm_as_ctrl_c() -> Iterator[None]:
    """``kill`` and container stops send SIGTERM, whose default ends the process on the spot:
    unwind like Ctrl-C instead, so staged outputs and temporary files are removed."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# A full (oldest-generation) collection walks every live object. torch and transformers create ~400k
# objects while they import and almost no garbage cycles: at CPython's default (one full collection
# per 10 of the middle generation) six full collections run during those imports alone, 0.4 s of a
# 7 s find-neurons. One per 100 instead: the young generations still collect short-lived cycles.
FULL_COLLECTION_EVERY = 100


@contextmanager
def fewer_full_collections() -> Iterator[None]:
    """Full garbage collections 10× less often while the command runs; the thresholds come back after."""
    before = gc.get_threshold()
    gc.set_threshold(before[0], before[1], max(before[2], FULL_COLLECTION_EVERY))
    try:
        yield
    finally:
        gc.set_threshold(*before)


@contextmanager
def _torchrun(argv: list[str]) -> Iterator[None]:
    """Under torchrun: data-parallel commands only, one process group, and output from rank 0 only
    (the other ranks compute quietly; their errors still reach the log, see :func:`_error`)."""
    if not distributed.under_torchrun():
        yield
        return
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is not None and command not in DATA_PARALLEL:
        raise distributed.NotDataParallel(
            f"surgery {command} does not run data-parallel; run it without torchrun "
            f"(under torchrun: {', '.join(DATA_PARALLEL)})"
        )
    # help and usage need no process group: with RANK and WORLD_SIZE left in the environment,
    # `surgery --help` waited for processes that never come
    helping = command is None or not {"--help", "-h"}.isdisjoint(argv)
    with nullcontext() if helping else distributed.session():
        if distributed.is_main():
            yield
            return
        with open(os.devnull, "w") as sink, redirect_stdout(sink), redirect_stderr(sink):
            yield


def _error(message: str, exc: BaseException | None = None, as_json: bool = False) -> None:
    """The one ``Error: …`` line; under torchrun rank 0's as is, another rank's marked with its rank,
    and what every rank detects alike (ranks that disagree, a command that does not split) said by
    rank 0 alone. With ``--json`` also ``{"error": …, "type": …}`` on stdout (rank 0's), so that a
    program reading the command's JSON gets an answer on failure too."""
    rank = distributed.world().rank
    if rank and isinstance(exc, distributed.SAID_BY_RANK_0):
        return
    click.echo(f"Error (rank {rank}): {message}" if rank else f"Error: {message}", err=True)
    if as_json and not rank:
        kind = type(exc).__name__ if exc is not None else "Interrupted"
        click.echo(json.dumps({"error": message, "type": kind}, ensure_ascii=False))


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, mapping every failure to one line and a non-zero exit.

    As the program (``argv`` None: the ``surgery`` script, ``python -m surgery``) a command that
    succeeded ends the process without the interpreter's teardown (:mod:`surgery.cli.leave`); called
    with arguments (tests, benchmarks in one process) it returns."""
    program = argv is None
    _run(list(sys.argv[1:]) if program else list(argv))
    if program:
        from .leave import leave

        leave(0)


def _aside() -> Aside:
    """Work aside (a GGUF's first import) on stderr: a note and plain progress lines. The console is
    imported on the first report, not at start-up."""

    def stages(stage: str, done: int, total: int) -> None:
        from .console import aside_stage

        aside_stage(stage, done, total)

    def said(message: str) -> None:
        from .console import note

        note(message)

    return Aside(stages, said)


def _run(argv: list[str]) -> None:
    """One command line: its errors become one line and an exit code (``SystemExit``)."""
    debug = "--debug" in argv
    as_json = "--json" in argv  # the commands' own --json: their errors are JSON on stdout too
    try:
        # The command's module is imported when click resolves it, inside the try: a package
        # missing at import time is one line too.
        # the notes aside first: joining torchrun's group says so when the other processes are late
        with fewer_full_collections(), _sigterm_as_ctrl_c(), reporting_aside(_aside()), _torchrun(argv):
            code = cli.main(args=argv, prog_name="surgery", standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except SurgeryError as exc:
        if debug:
            raise
        _error(_one_line(_for_the_command_line(exc)), exc, as_json)
        sys.exit(2)
    except click.exceptions.Abort:
        _error("interrupted; nothing was left half-written", None, as_json)
        sys.exit(130)
    except click.ClickException as exc:
        if debug:
            raise
        _error(f"{_one_line(exc.format_message())} (see --help)", exc, as_json)
        sys.exit(exc.exit_code or 2)
    except KeyboardInterrupt:
        _error("interrupted; nothing was left half-written", None, as_json)
        sys.exit(130)
    except OSError as exc:
        if debug:
            raise
        where = f": {exc.filename}" if exc.filename else ""
        _error(f"{exc.strerror or exc}{where}", exc, as_json)
        sys.exit(1)
    except ImportError as exc:  # a package missing from a partial install: say what to install
        if debug or not exc.name:
            raise
        from ..core.optional import install_hint

        _error(install_hint(exc.name), exc, as_json)
        sys.exit(2)
    except Exception as exc:  # a bug: still one line, the traceback on request
        if _while_interrupted(exc):  # raised while Ctrl-C unwound the work: the Ctrl-C is what happened
            _error("interrupted; nothing was left half-written", None, as_json)
            sys.exit(130)
        if debug:
            raise
        _error(
            f"internal error ({type(exc).__name__}: {_one_line(exc)}); rerun with --debug "
            "for the traceback and please report it",
            exc,
            as_json,
        )
        sys.exit(1)


def _while_interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while a Ctrl-C propagated (its context chain holds the KeyboardInterrupt):
    CPython's lock code can fail so when the signal lands inside a wait ("release unlocked lock")."""
    seen: set[int] = set()
    cause: BaseException | None = exc.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__context__
    return False


if __name__ == "__main__":
    main()
