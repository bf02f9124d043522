"""Terminal output: rich tables on stdout, progress bars on stderr, JSON for machines."""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any, Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)

STAGE_LABELS = {"copy": "copying", "patch": "patching", "verify": "verifying logits", "hash": "hashing"}


def print_json(data: Any) -> None:
    """Machine-readable output: plain JSON on stdout, nothing else."""
    print(json.dumps(data, indent=1, default=str))


@contextmanager
def stage_progress(enabled: bool = True) -> Iterator[Any]:
    """A progress callback ``(stage, done, total)`` drawing one bar per stage on stderr."""
    if not enabled:
        yield lambda stage, done, total: None
        return
    columns = [TextColumn("{task.description:<16}"), BarColumn(), TaskProgressColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=err, transient=False) as bar:
        tasks: dict[str, Any] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(STAGE_LABELS.get(stage, stage), total=max(total, 1))
            bar.update(tasks[stage], completed=done, total=max(total, 1))

        yield update


@contextmanager
def item_progress(description: str, total: int, enabled: bool = True) -> Iterator[Any]:
    """A progress callback ``advance(n)`` for loops over prompts or batches."""
    if not enabled:
        yield lambda n=1: None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                  TimeRemainingColumn(), console=err) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)


