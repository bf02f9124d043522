#!/usr/bin/env python3
"""Benchmark: what the bake's run of the source costs (surgery/bake/runnable.py), first and remembered.

    python examples/bench_bake_run.py [MODEL] [--runs 3] [--neurons 3:5]

Times, interleaved and in fresh child processes, ``surgery prune-neurons MODEL --neurons 3:5 --out DIR``:

* ``first``: the source's run not remembered (its cache entry removed before each run): the bake
  imports torch and transformers, loads the model and runs one forward pass while it copies;
* ``remembered``: the same command again, the run remembered (a second bake from the source);
* ``no-verify``: ``--no-verify`` (no run, no check of the edited maps).

Every run shares one cache folder, so all three take the source's sha256s from the hash cache (only
the run differs). Prints the machine line, each run, and the medians with peak RSS (``os.wait4``).
MODEL defaults to SmolLM2-135M-Instruct in ``$SURGERY_MODELS`` (``examples/get_models.py`` puts it there).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import stamp  # noqa: E402

MODELS = Path(os.environ.get("SURGERY_MODELS", Path.home() / ".cache" / "surgery" / "models"))
METHODS = ("first", "remembered", "no-verify")


def run(method: str, model: Path, neurons: str, out: Path, cache: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one bake in a child process."""
    if method == "first":
        shutil.rmtree(cache / "runnable", ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "surgery", "prune-neurons", str(model), "--neurons", neurons, "--out", str(out)]
    cmd += ["--no-verify"] if method == "no-verify" else []
    env = dict(os.environ, SURGERY_CACHE=str(cache), HF_HUB_OFFLINE="1")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{method} failed:\n{err.decode()}")
    return wall, usage.ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", type=Path, default=MODELS / "smollm2-135m-instruct")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--neurons", default="3:5")
    args = parser.parse_args(argv)
    if not (args.model / "config.json").is_file():
        sys.exit(f"no model at {args.model}; run `python examples/get_models.py` or name a checkpoint folder")
    stamp()
    with tempfile.TemporaryDirectory(prefix="bench-bake-run-") as scratch:
        scratch = Path(scratch)
        cache = scratch / "cache"
        run("first", args.model, args.neurons, scratch / "warm", cache)  # page cache and hash cache warm
        time.sleep(2.5)  # a file written less than 2 s before it is hashed is not remembered
        run("remembered", args.model, args.neurons, scratch / "warm", cache)
        results: dict[str, list[tuple[float, float]]] = {m: [] for m in METHODS}
        for i in range(args.runs):  # interleaved: drift in the machine's load hits every method alike
            for method in METHODS:
                results[method].append(run(method, args.model, args.neurons, scratch / "out", cache))
                wall, rss = results[method][-1]
                print(f"  run {i + 1}/{args.runs} {method:<10} {wall:6.2f} s  {rss:6.0f} MB", flush=True)
    base = statistics.median(w for w, _ in results["no-verify"])
    print(f"{'bake':<10} {'median':>8} {'min':>8} {'vs --no-verify':>15} {'peak RSS':>9}")
    for method, runs in results.items():
        median = statistics.median(w for w, _ in runs)
        print(
            f"{method:<10} {median:7.2f}s {min(w for w, _ in runs):7.2f}s {median - base:+14.2f}s "
            f"{max(r for _, r in runs):6.0f} MB"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
