#!/usr/bin/env python3
"""Benchmark at real scale: bake and verify a 16 GB checkpoint with Llama-3.1-8B's shapes, against `cp`.

    python examples/bench_big.py [--layers 32] [--runs 1] [--scratch DIR] [--json FILE]

Builds the random bf16 checkpoint (examples/synthetic_checkpoint.py; 32 layers = 16 GB), then
times, interleaved in a shuffled order and as a user runs them, each from a warm page cache (the
source read just before) and with no earlier output left to write back:

* ``cp -r SRC DST`` (the floor: every byte is written once);
* ``surgery prune-neurons SRC --neurons <40 neurons> --no-verify --out DST``;
* the same command with its default check (``--dtype bfloat16``: the CPU computes in bf16);
* ``surgery verify SRC DST --dtype bfloat16`` on the default command's output, right after it.

Each command's wall time, peak RSS (the kernel's VmHWM, which counts the file pages of weights
that transformers maps from disk) and peak anonymous memory (what the process itself holds) are
printed, with the ratios to ``cp``. Everything must fit this machine's 24 GB.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import stamp  # noqa: E402
from measure import run_measured  # noqa: E402
from synthetic_checkpoint import build  # noqa: E402

GB = 1e9


def neurons(layers: int, n: int = 40) -> str:
    """40 neurons spread over the layers (deterministic)."""
    return ",".join(f"{(7 * i) % layers}:{(1009 * i + 17) % 14336}" for i in range(n))


def timed(cmd: list[str]) -> dict:
    started = time.perf_counter()
    res, peak = run_measured(cmd)
    wall = time.perf_counter() - started
    if res.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{res.stderr[-3000:]}")
    return {"wall_s": wall, "rss_gb": peak.rss_bytes / GB, "anon_gb": peak.anon_bytes / GB}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/surgery-bench-big"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    machine = stamp()
    args.scratch.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    src = build(
        args.scratch / f"llama-3.1-8b-shapes-{args.layers}l",
        layers=args.layers,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    print(
        f"checkpoint: {size / GB:.2f} GB, {args.layers} layers (built/reused in {time.perf_counter() - started:.0f} s)",
        flush=True,
    )
    dst = args.scratch / "out"
    surgery = [sys.executable, "-m", "surgery"]
    bake = [*surgery, "prune-neurons", str(src), "--neurons", neurons(args.layers), "--out", str(dst)]
    methods = {
        "cp -r": ["cp", "-r", str(src), str(dst)],
        "prune-neurons --no-verify": [*bake, "--no-verify"],
        "prune-neurons (default check, bf16)": [*bake, "--dtype", "bfloat16"],
    }
    results: dict[str, list[dict]] = {name: [] for name in [*methods, "verify (bf16)"]}

    def record(run: int, name: str, cmd: list[str]) -> None:
        results[name].append(timed(cmd))
        r = results[name][-1]
        print(
            f"run {run + 1} {name:38s} {r['wall_s']:7.1f} s  RSS {r['rss_gb']:5.2f} GB  anon {r['anon_gb']:5.2f} GB",
            flush=True,
        )

    for run in range(args.runs):
        # Shuffled (seeded), and each command starts from the same state: no output folder (so no
        # dirty pages of an earlier one to write back) and the source read into the page cache
        # (verify, which reads 32 GB, evicts it).
        for name in random.Random(run).sample(list(methods), len(methods)):
            shutil.rmtree(dst, ignore_errors=True)
            subprocess.run(["cat", *map(str, src.glob("*.safetensors"))], stdout=subprocess.DEVNULL)
            record(run, name, methods[name])
            if name.startswith("prune-neurons (default"):  # verify checks this output (no room for two)
                record(run, "verify (bf16)", [*surgery, "verify", str(src), str(dst), "--dtype", "bfloat16"])
    shutil.rmtree(dst, ignore_errors=True)
    cp = statistics.median(r["wall_s"] for r in results["cp -r"])
    print(f"\nmedians of {args.runs} run(s), {size / GB:.1f} GB bf16 checkpoint")
    print(f"{'command':40s} {'wall':>8s} {'× cp':>6s} {'peak RSS':>9s} {'anon':>7s}")
    summary = {}
    for name, rows in results.items():
        wall = statistics.median(r["wall_s"] for r in rows)
        rss, anon = max(r["rss_gb"] for r in rows), max(r["anon_gb"] for r in rows)
        summary[name] = {"wall_s": wall, "x_cp": wall / cp, "peak_rss_gb": rss, "peak_anon_gb": anon}
        print(f"{name:40s} {wall:7.1f}s {wall / cp:5.2f}× {rss:7.2f} GB {anon:5.2f} GB")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"machine": machine, "size_gb": size / GB, "runs": args.runs, "results": results, "summary": summary},
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
