"""Hand memory a finished phase freed back to the operating system.

A model's many mid-size tensors are allocated from the C heap (glibc serves blocks below its mmap
threshold, which grows up to 32 MB, from the heap), and freeing them leaves the pages with the process:
the next phase's allocations do not always fit in them, so a command that drops one model and loads
another holds both. ``malloc_trim`` returns every free heap page (glibc 2.8 and later); elsewhere
(macOS, musl) nothing is done.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import weakref
from functools import cache


@cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None


def return_freed_memory(dropped: weakref.ref | None = None) -> None:
    """Free what only reference cycles still hold (a model's modules and hooks), then give the C heap's
    free pages back to the operating system where the C library can.

    ``dropped``: a weak reference to what the caller just let go (its model). A full collection walks
    every object of the process (0.15 s once torch and transformers are imported), so it runs only
    when that object is still alive, i.e. held by a cycle; one freed by its last reference needs none.
    """
    if dropped is None or dropped() is not None:
        gc.collect()
    trim_heap()


def trim_heap() -> None:
    """Give the C heap's free pages back to the operating system where the C library can (no garbage
    collection: cheap enough, well under a millisecond, to call once per forward pass). A batch's
    activations freed between the small tensors it keeps leave holes the next batch's do not always fit
    in, so a loop of forward passes grows the heap by a batch's worth each time otherwise."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
