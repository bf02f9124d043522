"""How library code reports progress without knowing about screens.

Long computations take a :data:`Progress` factory: ``progress(description, total)`` returns an
``advance(n=1)`` callback for one measurement. The command line passes one that draws bars on a
terminal and prints plain lines in logs (``surgery.cli.console.progress_bars``); library callers get
:func:`silent` by default. Stage-wise work (bake, verify) reports ``(stage, done, total)``.
"""

from __future__ import annotations

from collections.abc import Callable

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
