"""Terminal output: rich tables on stdout, progress bars on stderr, JSON for machines."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console

from ..core import finite_json
from ..core.progress import Progress

if TYPE_CHECKING:  # rich's tables and bars are imported where drawn: `surgery --help` stays fast
    from rich.progress import Progress as Bars
    from rich.table import Table

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)
# In a log (stderr not a terminal) a note stays one line, whole for grep; rich would wrap it at 80.
err.soft_wrap = not err.is_terminal

STAGE_LABELS = {
    "copy": "copying",
    "patch": "patching",
    "verify": "verifying logits",
    "run": "running the source",
    "check": "checking edited weights",
    "hash": "hashing",
    "compare": "comparing with the source",
    "dequantize": "dequantizing",
    "write": "writing",
}
# When stderr is not a terminal (a log file, CI), a rich bar is drawn only when it ends: print a
# plain line instead, at most this often, so that a long job shows it is alive.
LOG_EVERY_SECONDS = 30.0
_UNBOUNDED = 100_000  # a width no table reaches: measures its natural width
_FINISHED = float("inf")  # LogLines.last of a task whose completion line is out


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class LogLines:
    """Progress as plain lines for logs: ``description: done/total (pct) elapsed, ~left`` at most
    every ``every`` seconds per task, and once when a task completes."""

    def __init__(
        self,
        write: Callable[[str], None],
        every: float = LOG_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.write, self.every, self.clock = write, every, clock
        self.started: dict[str, float] = {}
        self.last: dict[str, float] = {}

    def begin(self, description: str) -> None:
        """Start the clock of ``description`` (otherwise its first update starts it)."""
        self.started.setdefault(description, self.clock())

    def update(self, description: str, done: int, total: int) -> None:
        now = self.clock()
        start = self.started.setdefault(description, now)
        if self.last.get(description) == _FINISHED:
            return  # its completion line is out already
        finished = done >= total
        if not finished and now - self.last.get(description, start) < self.every:
            return
        self.last[description] = _FINISHED if finished else now
        elapsed = now - start
        left = f", ~{_duration(elapsed * (total - done) / done)} left" if 0 < done < total else ""
        self.write(
            f"{description}: {done:,}/{total:,} ({100 * done / max(total, 1):.0f} %) {_duration(elapsed)} elapsed{left}"
        )


def _log_line(text: str) -> None:
    err.print(text, markup=False, highlight=False)


_ASIDE_LINES = LogLines(lambda text: _log_line(text))  # one clock per stage, for the whole command


def aside_stage(stage: str, done: int, total: int) -> None:
    """Work aside (surgery.core.progress.aside) as plain lines, every 30 s and at each end: it may run
    while a command's own bars are drawn, which a second set of bars would clash with."""
    _ASIDE_LINES.update(STAGE_LABELS.get(stage, stage), done, max(total, 1))


def note(message: str) -> None:
    """A note on stderr (one line in logs): something the user should know, not an error."""
    err.print(f"[yellow]note:[/] {message}")


def print_table(table: Table) -> None:
    """``table`` on stdout, never cut short with "…": in a pipe or a file as wide as it needs (rich
    would fit it into COLUMNS, or 80, and cut headers and numbers); in a narrower terminal its cells
    wrap instead."""
    from rich.measure import Measurement

    needed = Measurement.get(out, out.options.update_width(_UNBOUNDED), table).maximum
    if needed <= out.width:
        out.print(table)
    elif not out.is_terminal:  # Console.print(width=) only narrows: a console of that width
        Console(file=out.file, width=needed, highlight=False, color_system=None).print(table)
    else:
        for column in table.columns:
            column.no_wrap, column.overflow = False, "fold"
        out.print(table)


def print_json(data: Any) -> None:
    """Machine-readable output: plain JSON on stdout, nothing else."""
    print(finite_json.dumps(data, indent=1, default=str))  # a missing number: null, as jq reads


def _bars(label_width: int, **options: Any) -> Bars:
    """rich's progress display on stderr: a label, a bar, the percentage, the time left."""
    from rich.progress import BarColumn, TaskProgressColumn, TextColumn, TimeRemainingColumn
    from rich.progress import Progress as Bars

    label = TextColumn(f"{{task.description:<{label_width}}}")
    return Bars(label, BarColumn(), TaskProgressColumn(), TimeRemainingColumn(), console=err, **options)


@contextmanager
def stage_progress(enabled: bool = True) -> Iterator[Any]:
    """A progress callback ``(stage, done, total)`` drawing one bar per stage on stderr."""
    if not enabled:
        yield lambda stage, done, total: None
        return
    if not err.is_terminal:
        lines = LogLines(_log_line)
        yield lambda stage, done, total: lines.update(STAGE_LABELS.get(stage, stage), done, max(total, 1))
        return
    with _bars(16, transient=False) as bar:
        tasks: dict[str, Any] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(STAGE_LABELS.get(stage, stage), total=max(total, 1))
            bar.update(tasks[stage], completed=done, total=max(total, 1))

        yield update


@contextmanager
def progress_bars() -> Iterator[Progress]:
    """A :data:`surgery.core.progress.Progress` for library code: one bar per measurement on a terminal,
    plain lines (every 30 s and at each end) in a log; always on stderr."""
    if not err.is_terminal:

        def log_factory(description: str, total: int) -> Callable[..., None]:
            # one LogLines per measurement: the same description comes again for the next model
            lines, done = LogLines(_log_line), [0]
            lines.begin(description)

            def advance(n: int = 1) -> None:
                done[0] += n
                lines.update(description, done[0], max(total, 1))

            return advance

        yield log_factory
        return
    with _bars(18) as bar:

        def factory(description: str, total: int) -> Callable[..., None]:
            task = bar.add_task(description, total=max(total, 1))
            return lambda n=1: bar.advance(task, n)

        yield factory


@contextmanager
def both_progress() -> Iterator[tuple[Progress, Callable[[str, int, int], None]]]:
    """A measurement :data:`Progress` and a stage progress that share one display (a terminal shows
    one live display at a time): for commands that find, then bake."""
    if not err.is_terminal:
        with progress_bars() as progress, stage_progress() as stages:
            yield progress, stages
        return
    with _bars(18) as bar:
        tasks: dict[str, Any] = {}

        def factory(description: str, total: int) -> Callable[..., None]:
            task = bar.add_task(description, total=max(total, 1))
            return lambda n=1: bar.advance(task, n)

        def stages(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(STAGE_LABELS.get(stage, stage), total=max(total, 1))
            bar.update(tasks[stage], completed=done, total=max(total, 1))

        yield factory, stages
