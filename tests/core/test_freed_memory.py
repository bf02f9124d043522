"""return_freed_memory gives back the heap pages that freed mid-size buffers leave with the process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import REPO

# In a fresh interpreter: 300 buffers of 1 MiB from the heap (one freed 8 MiB buffer first raises glibc's
# mmap threshold above them, as a model's larger tensors do), held in a reference cycle as a model's
# modules are; small buffers between them stay, so the heap cannot shrink from its top on its own.
CHILD = """
import sys
from surgery.core.freed_memory import return_freed_memory
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) // 1024
first = bytearray(8 << 20)
del first
class Holder:
    pass
holder = Holder()
holder.me = holder
holder.buffers, pins = [], []
for _ in range(300):
    buffer = bytearray(1 << 20)  # calloc: no temporary copy
    buffer[::4096] = b"x" * 256  # one byte a page: resident
    holder.buffers.append(buffer)
    pins.append(bytearray(b"y" * 1024))  # kept: the freed buffers are holes, not the heap's top
del holder, buffer
held = rss()
return_freed_memory()
print(held, rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_buffers_in_a_cycle_leave_the_process():
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, capture_output=True, text=True, check=True)
    held, after = map(int, out.stdout.split())
    assert held - after >= 250, (held, after)  # MiB: most of the 300 given back


def test_a_full_collection_only_for_what_a_cycle_still_holds(monkeypatch):
    """A model freed by its last reference needs no collection (it walks every object: 0.15 s with
    torch and transformers imported); one a reference cycle holds is collected."""
    import gc
    import weakref

    from surgery.core import freed_memory

    calls = []
    monkeypatch.setattr(freed_memory.gc, "collect", lambda *a: calls.append(a) or 0)

    class Model:
        pass

    gc.disable()  # no automatic collection frees the cycle before the call does
    try:
        plain, cyclic = Model(), Model()
        cyclic.me = cyclic
        gone, held = weakref.ref(plain), weakref.ref(cyclic)
        del plain, cyclic
        freed_memory.return_freed_memory(gone)
        assert calls == []
        freed_memory.return_freed_memory(held)
        assert len(calls) == 1
        freed_memory.return_freed_memory()  # nothing named: always
        assert len(calls) == 2
    finally:
        gc.enable()
        monkeypatch.undo()
    gc.collect()
    assert held() is None
