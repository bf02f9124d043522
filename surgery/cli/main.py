"""The ``surgery`` entry point: runs the click group; every error becomes one ``Error: …`` line."""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

import click

from ..core.errors import SurgeryError
from .group import cli


def _register() -> None:
    # Each module adds its commands to the group; importing them here keeps start-up in one place.
    from . import core, gguf, heads, neurons, ship  # noqa: F401


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


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


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, mapping every failure to one line and a non-zero exit."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        _register()  # inside the try: a package missing at import time is one line too
        with _sigterm_as_ctrl_c():
            code = cli.main(args=argv, prog_name="surgery", standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except SurgeryError as exc:
        if debug:
            raise
        click.echo(f"Error: {_one_line(exc)}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("Error: interrupted; nothing was left half-written", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        if debug:
            raise
        click.echo(f"Error: {_one_line(exc.format_message())} (see --help)", err=True)
        sys.exit(exc.exit_code or 2)
    except KeyboardInterrupt:
        click.echo("Error: interrupted; nothing was left half-written", err=True)
        sys.exit(130)
    except OSError as exc:
        if debug:
            raise
        where = f": {exc.filename}" if exc.filename else ""
        click.echo(f"Error: {exc.strerror or exc}{where}", err=True)
        sys.exit(1)
    except ImportError as exc:  # a package missing from a partial install: say what to install
        if debug or not exc.name:
            raise
        from ..core.optional import install_hint

        click.echo(f"Error: {install_hint(exc.name)}", err=True)
        sys.exit(2)
    except Exception as exc:  # a bug: still one line, the traceback on request
        if debug:
            raise
        click.echo(f"Error: internal error ({type(exc).__name__}: {_one_line(exc)}); rerun with --debug "
                   "for the traceback and please report it", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
