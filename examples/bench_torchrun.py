"""Data-parallel scaling: the same command in 1 process × 1 thread and under torchrun, N × 1 thread.

Each command runs from the command line as a user runs it (start-up, model load and all), with a
fresh findings cache, first alone (``OMP_NUM_THREADS=1 python -m surgery …``), then as
``OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node N -m surgery …`` (gloo on a CPU). It
prints both wall times, their ratio, and whether the two printed the same result.

    python examples/bench_torchrun.py ~/.cache/surgery/models/smollm2-135m-instruct --nproc 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import stamp

REPO = Path(__file__).resolve().parents[1]


def commands(model: str, max_pairs: int) -> dict[str, list[str]]:
    """find-neurons on the builtin English pairs, score-binding on a subset of the benchmark."""
    return {
        "find-neurons": ["find-neurons", model, "--language", "en", "--json"],
        "score-binding": ["score-binding", model, "--max-pairs", str(max_pairs), "--json"],
    }


def timed(cmd: list[str]) -> tuple[float, dict]:
    """Wall seconds and the printed JSON of ``cmd``, one thread per process, fresh cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(
            os.environ,
            OMP_NUM_THREADS="1",
            SURGERY_CACHE=cache,
            HF_HUB_OFFLINE="1",
            PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        )
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
        seconds = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return seconds, json.loads(done.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--max-pairs", type=int, default=64, help="score-binding's pairs (4 prompts each)")
    args = ap.parse_args()
    stamp()
    print(f"load average {os.getloadavg()[0]:.2f} at start; {args.model}")
    print(f"{'command':<14} {'1 × 1 thread':>13} {f'{args.nproc} × 1 thread':>13} {'speed-up':>9}  same result")
    for name, argv in commands(args.model, args.max_pairs).items():
        one, single = timed([sys.executable, "-m", "surgery", *argv])
        many, multi = timed(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                str(args.nproc),
                "-m",
                "surgery",
                *argv,
            ]
        )
        key = "summary" if name == "find-neurons" else "S"
        same = "yes" if single[key] == multi[key] else "NO"
        print(f"{name:<14} {one:>12.1f}s {many:>12.1f}s {one / many:>8.2f}×  {same}")
    print(f"load average {os.getloadavg()[0]:.2f} at end (other work on the machine slows both sides)")


if __name__ == "__main__":
    main()
