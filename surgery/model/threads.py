"""How many CPU threads torch computes with, for the commands that run many small passes (surgery tune).

torch starts one thread per core. A small model's passes are short, and every one of them ends in a
barrier where each thread waits for the others: on cores that other jobs also hold, a thread that
is not scheduled keeps all the rest waiting. On a 2-core machine at load 7 a SmolLM2-135M tune
trial took 60 s on 2 threads and 8 s on one (docs/guides/tune.md). So, unless the user says
otherwise (``--threads``, or ``OMP_NUM_THREADS``, which torch reads itself), the trials run on the
cores the machine's other jobs leave idle by the 1-minute load average, at least one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def idle_cores() -> int:
    """The cores the machine's other jobs leave idle: usable cores less the 1-minute load average
    (rounded), at least one; all usable cores where the system gives no load average."""
    cores = usable_cores()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return cores
    return max(1, min(cores, cores - round(load)))


@contextmanager
def threads(requested: int | None) -> Iterator[int]:
    """Inside this context torch computes on ``requested`` threads; else on ``OMP_NUM_THREADS``'s (set:
    the user chose); else on :func:`idle_cores`. Yields the count; torch's count before is restored."""
    import torch

    before = torch.get_num_threads()
    if requested is not None:
        torch.set_num_threads(requested)
    elif not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(idle_cores())
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
