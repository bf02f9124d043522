#!/usr/bin/env python3
"""Which machine a time came from: the CPU's model and flags, and its matmul rates measured now.

    python examples/machine.py [--json FILE] [--threads N]

Times from different machines (Intel or AMD, AVX2 or AVX-512, native bf16 or not) cannot be
compared by themselves; a time divided by the machine's own float32 matmul rate, measured in the
same run, can. Every benchmark under examples/ and the quickstart record this description beside
their times. The rates are the median of several square matmuls at the size finders run (the
hidden width of a small model times a batch of tokens), with torch's threads as the run has them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# The flags that decide which kernels torch runs on a CPU (vector width, native bf16/fp16, AMX).
KERNEL_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "avx_vnni",
    "amx_bf16",
    "amx_tile",
)


def cpu_model_and_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, list[str]]:
    """The first CPU's model name and which of :data:`KERNEL_FLAGS` it has (Linux; else platform's)."""
    model, flags = platform.processor() or platform.machine(), set()
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name":
                model = value.strip()
            elif key == "flags":
                flags = set(value.split())
                break  # every core of a VM reports the same; the first one decides
    return model, [f for f in KERNEL_FLAGS if f in flags]


def _mm_seconds(dtype: Any, size: int, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` ``size``-square matmuls, after one warm-up (kernel choice, caches)."""
    import torch

    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    torch.mm(a, b)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        seconds.append(time.perf_counter() - start)
    return seconds


def matmul_gflops(dtype: Any, size: int = 1024, repeats: int = 7, budget_s: float = 1.0) -> float:
    """Median GFLOP/s of square matmuls in ``dtype``, ``size`` wide or less.

    A CPU without native bf16 runs bf16 matmuls ~100× slower than float32: a 256-wide probe sets the
    largest power-of-two size whose repeats fit ``budget_s``, so a record costs seconds on any machine."""
    probe = 2 * 256**3 / min(_mm_seconds(dtype, 256, 2))
    while size > 256 and 2 * size**3 * repeats / probe > budget_s:
        size //= 2
    return statistics.median(2 * size**3 / t / 1e9 for t in _mm_seconds(dtype, size, repeats))


def describe(measure: bool = True) -> dict[str, Any]:
    """The machine as one JSON-ready record: CPU model and kernel flags, cores, threads, matmul rates."""
    model, flags = cpu_model_and_flags()
    record: dict[str, Any] = {
        "cpu": model,
        "flags": flags,
        "cores": os.cpu_count(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    if measure:
        import torch

        record["torch"] = torch.__version__
        record["threads"] = torch.get_num_threads()
        record["matmul_gflops_float32"] = round(matmul_gflops(torch.float32), 1)
        record["matmul_gflops_bfloat16"] = round(matmul_gflops(torch.bfloat16), 1)
    return record


def one_line(record: dict[str, Any]) -> str:
    """The record as the one line benchmarks print above their tables."""
    rates = ""
    if "matmul_gflops_float32" in record:
        rates = (
            f", matmul {record['matmul_gflops_float32']:.0f} GFLOP/s float32"
            f" / {record['matmul_gflops_bfloat16']:.0f} bfloat16 on {record['threads']} threads"
        )
    flags = " ".join(record["flags"]) or "no AVX2"
    return f"{record['cpu']} ({record['cores']} CPUs; {flags}){rates}, load {record['load_average_1min']}"


def stamp() -> dict[str, Any]:
    """Measure the machine in a child process, print its one line, and return the record.

    Benchmarks call this first. A child keeps torch and its thread pool out of the caller, whose own
    memory peaks and imports are often what it measures."""
    done = subprocess.run([sys.executable, __file__, "--json", "-"], capture_output=True, text=True, check=True)
    record = json.loads(done.stdout)
    print(f"machine: {one_line(record)}", flush=True)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="also write the record to this file ('-': print only the record)")
    ap.add_argument("--describe", type=Path, default=None, help="print the one line of a record written before")
    ap.add_argument("--threads", type=int, default=None, help="torch threads for the matmuls (default: torch's)")
    args = ap.parse_args(argv)
    if args.describe:
        print(one_line(json.loads(args.describe.read_text())))
        return 0
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    record = describe()
    if args.json == "-":
        print(json.dumps(record))
        return 0
    print(one_line(record))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
