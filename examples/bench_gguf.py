#!/usr/bin/env python3
"""Benchmark: baking 40 pruned neurons + 3 heads (α = 2) into a GGUF, against ``cp`` of the same file.

    python examples/bench_gguf.py [GGUF] [--runs 5] [--json FILE]

GGUF defaults to SmolLM2-135M-Instruct Q4_1 where examples/get_models.py puts it. Times, interleaved,
each in a fresh child process on a warm page cache, with the child's peak RSS from ``os.wait4``:

* ``cp SRC DST`` (the floor: every byte is written once);
* ``lib``: ``surgery.gguf.bake.bake_gguf`` called in a child (imports not counted): header, plan,
  edited blocks, one streaming copy with both sha256s, sidecars;
* ``cli``: ``surgery apply RECIPE --model SRC --out DST`` as a user runs it (interpreter start and imports
  included).

The transformers config of the GGUF and the source's sha256 are cached by the first bake (a user's
second bake from a file); ``first`` is one CLI run with empty caches. Medians are printed, with the
ratio to cp's median.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import stamp

MODELS = Path(os.environ.get("SURGERY_MODELS", Path.home() / ".cache" / "surgery" / "models"))
DEFAULT = MODELS / ".gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
REPO = Path(__file__).resolve().parent.parent

CONFIG_CHILD = """
import json, sys
from surgery.gguf.model import open_gguf
print(json.dumps(open_gguf(sys.argv[1]).config))
"""
LIB_CHILD = """
import sys, time
from pathlib import Path
from surgery.core.edits import Recipe
from surgery.gguf.bake import bake_gguf
from surgery.gguf.model import open_gguf
t = time.perf_counter()
bake_gguf(open_gguf(sys.argv[1]), Recipe.load(sys.argv[2]), Path(sys.argv[3]))
print(time.perf_counter() - t)
"""


def recipe_text(layers: int, ffn: int, heads: int, seed: int = 0) -> str:
    """40 random neurons (pruned) and 3 random heads (α = 2) as a recipe YAML."""
    rng = random.Random(seed)
    neurons = rng.sample([(la, n) for la in range(layers) for n in range(ffn)], 40)
    chosen = rng.sample([(la, h) for la in range(layers) for h in range(heads)], 3)
    lines = ["version: 1", "edits:"]
    lines += [f"- {{type: neuron, layer: {la}, neuron: {n}, factor: 0.0}}" for la, n in neurons]
    lines += [f"- {{type: head, layer: {la}, head: {h}, alpha: 2.0}}" for la, h in chosen]
    return "\n".join(lines) + "\n"


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MB, stdout) of ``cmd`` in a child."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    out = proc.stdout.read().decode()
    err = proc.stderr.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err}")
    return wall, usage.ru_maxrss / 1024, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if not args.gguf.is_file():
        raise SystemExit(f"{args.gguf} not found; run `python examples/get_models.py` first")
    machine = stamp()
    with tempfile.TemporaryDirectory(prefix="bench-gguf-") as tmp:
        tmp = Path(tmp)
        # This process imports nothing heavy: a child's peak RSS counts its parent's pages before exec.
        env = dict(os.environ, SURGERY_CACHE=str(tmp / "cache"), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        config = json.loads(timed([sys.executable, "-c", CONFIG_CHILD, str(args.gguf)], env)[2])
        recipe = tmp / "recipe.yaml"
        recipe.write_text(
            recipe_text(config["num_hidden_layers"], config["intermediate_size"], config["num_attention_heads"])
        )
        out = tmp / "out.gguf"

        def clear() -> None:
            for p in tmp.glob("out.gguf*"):
                p.unlink()

        cli = [sys.executable, "-m", "surgery", "apply", str(recipe), "--model", str(args.gguf), "--out", str(out)]
        first = timed(cli, dict(env, SURGERY_CACHE=str(tmp / "cold")))  # config read from the GGUF, source hashed
        clear()
        timed(cli, env)  # warm-up: the source's sha256 goes to the hash cache
        clear()
        results: dict[str, list[tuple[float, float]]] = {"cp": [], "lib": [], "cli": []}
        for _ in range(args.runs):
            results["cp"].append(timed(["cp", str(args.gguf), str(out)], env)[:2])
            clear()
            wall, rss, printed = timed([sys.executable, "-c", LIB_CHILD, str(args.gguf), str(recipe), str(out)], env)
            results["lib"].append((float(printed.strip().splitlines()[-1]), rss))
            clear()
            results["cli"].append(timed(cli, env)[:2])
            clear()
    size = args.gguf.stat().st_size / 2**20
    cp = statistics.median(w for w, _ in results["cp"])
    print(f"{args.gguf.name}: {size:.0f} MiB, 40 neurons pruned + 3 heads × 2, median of {args.runs} runs")
    print(f"{'':6} {'seconds':>8} {'× cp':>6} {'peak RSS MB':>12}")
    summary = {
        "machine": machine,
        "file": args.gguf.name,
        "mib": round(size, 1),
        "runs": args.runs,
        "first_cli_s": round(first[0], 3),
        "first_cli_rss_mb": round(first[1], 1),
    }
    for name, rows in results.items():
        wall = statistics.median(w for w, _ in rows)
        rss = statistics.median(r for _, r in rows)
        print(f"{name:6} {wall:8.3f} {wall / cp:6.1f} {rss:12.0f}")
        summary[name] = {"median_s": round(wall, 3), "ratio_to_cp": round(wall / cp, 2), "peak_rss_mb": round(rss, 1)}
    print(f"first  {first[0]:8.3f} {first[0] / cp:6.1f} {first[1]:12.0f}   (cli, empty caches)")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
