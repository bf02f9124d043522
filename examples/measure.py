"""Peak memory of a child process: the kernel's high-water mark of its resident set (VmHWM) and
the sampled peak of its anonymous memory (RssAnon).

The difference matters for big checkpoints: safetensors weights that transformers maps from the
file count as resident *file* pages, which the kernel drops and re-reads under memory pressure, so
a process can run a model larger than RAM; anonymous memory is what it really holds.

VmHWM is read from /proc, not taken from ``os.wait4``'s ``ru_maxrss``: at exec the kernel keeps the
high-water mark of the memory the child was forked with, so ``ru_maxrss`` of a child of a big Python
parent is at least the parent's RSS (`cp` measured 0.56 GB from a bench that had imported transformers).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Peaks:
    rss_bytes: int = 0  # VmHWM: the kernel's exact high-water mark (file-backed pages included)
    anon_bytes: int = 0  # RssAnon, sampled every 20 ms: memory the process itself allocated
    killed: bool = False  # stopped by ``kill_above``: the peaks are where it was stopped


def _read(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "RssAnon"):
                out[key] = int(value.split()[0]) * 1024
    return out


def run_measured(
    cmd: Sequence[str], kill_above: int | None = None, **popen
) -> tuple[subprocess.CompletedProcess, Peaks]:
    """Run ``cmd`` (text output captured) and return its result with its memory peaks; killed once its
    VmHWM passes ``kill_above`` bytes (a shared machine's budget), which its peaks then say."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    peaks, done = Peaks(), threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                now = _read(proc.pid)
            except (FileNotFoundError, ProcessLookupError):
                return
            peaks.rss_bytes = max(peaks.rss_bytes, now.get("VmHWM", 0))
            peaks.anon_bytes = max(peaks.anon_bytes, now.get("RssAnon", 0))
            if kill_above is not None and peaks.rss_bytes > kill_above and not peaks.killed:
                peaks.killed = True
                proc.kill()
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    done.set()
    sampler.join()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), peaks
