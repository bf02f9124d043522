"""How library code reports progress without knowing about screens.

Long computations take a :data:`Progress` factory: ``progress(description, total)`` returns an
``advance(n=1)`` callback for one measurement. The command line passes one that draws bars on a
terminal and prints plain lines in logs (``surgery.cli.console.progress_bars``); library callers get
:func:`silent` by default. Stage-wise work (bake, verify) reports ``(stage, done, total)``.

Work a command does aside from what it was asked, that its caller's progress does not reach (a GGUF
imported into the cache the first time a command opens it), reports to :func:`aside`: silent, unless
the caller set it (:func:`reporting_aside`; the command line does, for every command).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

Advance = Callable[..., None]  # advance(n: int = 1)
Progress = Callable[[str, int], Advance]  # (description, total) -> advance
StageProgress = Callable[[str, int, int], None]  # (stage, done, total)


def _nothing(n: int = 1) -> None:
    pass


def silent(description: str, total: int) -> Advance:
    """A :data:`Progress` that reports nothing."""
    return _nothing


def silent_stages(stage: str, done: int, total: int) -> None:
    """A :data:`StageProgress` that reports nothing."""


def _no_note(message: str) -> None:
    pass


@dataclass(frozen=True)
class Aside:
    """Where work aside reports: its stages, and a note saying what it is and why."""

    stages: StageProgress = silent_stages
    note: Callable[[str], None] = _no_note


_ASIDE: ContextVar[Aside | None] = ContextVar("surgery_aside", default=None)


def aside() -> Aside:
    """Where work aside reports now (nowhere unless :func:`reporting_aside` said)."""
    return _ASIDE.get() or Aside()


@contextmanager
def reporting_aside(where: Aside) -> Iterator[None]:
    """Work aside reports to ``where`` within the block."""
    token = _ASIDE.set(where)
    try:
        yield
    finally:
        _ASIDE.reset(token)
