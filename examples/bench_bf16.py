#!/usr/bin/env python3
"""Benchmark: the finders in bfloat16 against float32 on a CPU, speed and agreement of the findings.

    OMP_NUM_THREADS=2 python examples/bench_bf16.py MODEL [--commands find-neurons,score-binding,find-heads]
        [--max-pairs 24] [--random-sets 4] [--runs 1] [--json FILE]

bfloat16 pays on a CPU only where it multiplies natively (AVX512-BF16 or AMX: the `machine:` line's
flags and its two matmul rates say whether this one does). For each finder the two dtypes run in this
process, alternated run by run, each with a fresh findings cache (``recompute``), and the benchmark
prints the wall time of each (median over ``--runs``), the speed-up (float32's time over bfloat16's)
and whether the findings agree:

- find-neurons: the overlap of the top-40 neurons (the prune-neurons default: fairness score,
  per-category selection), the smallest float32 top-k that holds bfloat16's top-40, and the
  BiasScores' largest difference (a share of the category's largest score) and correlation;
- score-binding: ΔS and ΔK with their t-tests, and whether bfloat16's ΔS lies within float32's 95 %
  interval (ΔS ± 1.96·ΔS/t over items);
- find-heads: the selected heads, the selection's knockout effect and CI, the random-set p-value and
  the conclusion ("effect" or "none").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_screening import conclusion
from machine import stamp

import surgery
from surgery.find.neurons.params import SelectParams

DTYPES = ("float32", "bfloat16")
COMMANDS = ("find-neurons", "score-binding", "find-heads")
TOP_N = 40


def _timed(call) -> tuple[Any, float]:
    start = time.perf_counter()
    result = call()
    return result, time.perf_counter() - start


def neurons(model: str, dtype: str, options: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    found, wall = _timed(lambda: surgery.find_neurons(model, recompute=True, dtype=dtype))
    chosen = found.select(TOP_N, SelectParams())
    return {"wall_s": wall, "top": [list(n) for n in chosen.neurons]}, found


def neurons_agree(runs: dict[str, dict[str, Any]], found: dict[str, Any]) -> dict[str, Any]:
    """The top-40s' overlap; the smallest float32 top-k holding bfloat16's whole top-40 (how far its
    swaps reach down float32's ranking); per category the largest BiasScore difference as a share of
    the category's largest score, and the scores' correlation."""
    top16 = {tuple(n) for n in runs["bfloat16"]["top"]}
    overlap = len(top16 & {tuple(n) for n in runs["float32"]["top"]})
    reach = next(
        (
            k
            for k in range(TOP_N, 20 * TOP_N + 1, 5)
            if top16 <= set(found["float32"].select(k, SelectParams()).neurons)
        ),
        None,
    )
    exact, other = found["float32"].scores.bias, found["bfloat16"].scores.bias
    scale_diff = max(float(np.max(np.abs(other[c] - e)) / np.max(np.abs(e))) for c, e in exact.items())
    correlation = min(float(np.corrcoef(other[c].ravel(), e.ravel())[0, 1]) for c, e in exact.items())
    return {
        "top_overlap": overlap,
        "top_n": TOP_N,
        "bf16_top_within_float32_top": reach,
        "max_bias_diff_of_scale": scale_diff,
        "min_bias_correlation": correlation,
    }


def binding(model: str, dtype: str, options: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    scores, wall = _timed(lambda: surgery.score_binding(model, dtype=dtype, max_pairs=options["max_pairs"]))
    out = {"wall_s": wall}
    for name in ("S", "K"):
        stats = getattr(scores, name)
        if stats is not None:
            out[name] = {"delta": stats.delta, "t": stats.t, "p": stats.p}
    return out, scores


def binding_agree(runs: dict[str, dict[str, Any]], _: dict[str, Any]) -> dict[str, Any]:
    exact, other = runs["float32"]["S"], runs["bfloat16"]["S"]
    half = 1.96 * abs(exact["delta"] / exact["t"]) if exact["t"] else float("nan")
    return {
        "dS_float32": exact["delta"],
        "dS_bfloat16": other["delta"],
        "dS_ci95_half_width": half,
        "within_ci": abs(other["delta"] - exact["delta"]) <= half,
    }


def heads(model: str, dtype: str, options: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    found, wall = _timed(
        lambda: (
            surgery.find_heads(
                model, recompute=True, dtype=dtype, max_pairs=options["max_pairs"], random_sets=options["random_sets"]
            ).data
        )
    )
    tested = found.knockout.tested
    return {
        "wall_s": wall,
        "selected_heads": [list(h) for h in found.selected_heads],
        "effect_pct": tested.effect_pct,
        "ci95": tested.ci95,
        "random_p": found.knockout.random.p,
        "conclusion": conclusion(found, options["level"]),
    }, found


def heads_agree(runs: dict[str, dict[str, Any]], _: dict[str, Any]) -> dict[str, Any]:
    exact, other = runs["float32"], runs["bfloat16"]
    lo, hi = exact["ci95"] or (None, None)
    within = lo is not None and lo <= other["effect_pct"] <= hi
    return {
        "same_heads": exact["selected_heads"] == other["selected_heads"],
        "same_conclusion": exact["conclusion"].split(" ")[0] == other["conclusion"].split(" ")[0],
        "effect_within_ci": within,
    }


FINDERS = {
    "find-neurons": (neurons, neurons_agree),
    "score-binding": (binding, binding_agree),
    "find-heads": (heads, heads_agree),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--commands", default=",".join(COMMANDS), help=f"comma-separated, of {', '.join(COMMANDS)}")
    ap.add_argument("--max-pairs", type=int, default=24, help="score-binding and find-heads' pairs")
    ap.add_argument("--random-sets", type=int, default=4, help="find-heads' random head sets")
    ap.add_argument("--level", type=float, default=0.05)
    ap.add_argument("--runs", type=int, default=1, help="runs of each dtype, alternated; the median wall time")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    commands = [c.strip() for c in args.commands.split(",") if c.strip()]
    unknown = sorted(set(commands) - set(COMMANDS))
    if unknown:
        ap.error(f"unknown command {unknown[0]!r}: choose from {', '.join(COMMANDS)}")
    options = {"max_pairs": args.max_pairs, "random_sets": args.random_sets, "level": args.level}
    record: dict[str, Any] = {"machine": stamp(), "model": args.model, "options": vars(args) | {"json": None}}
    for command in commands:
        run, agree = FINDERS[command]
        walls: dict[str, list[float]] = {d: [] for d in DTYPES}
        runs, found = {}, {}
        for _ in range(args.runs):
            for dtype in DTYPES:
                runs[dtype], found[dtype] = run(args.model, dtype, options)
                walls[dtype].append(runs[dtype]["wall_s"])
        median = {d: statistics.median(walls[d]) for d in DTYPES}
        result = {
            "runs": runs,
            "wall_s": median,
            "speedup": median["float32"] / median["bfloat16"],
            "agreement": agree(runs, found),
        }
        record[command] = result
        print(
            f"{command}: float32 {median['float32']:.1f} s, bfloat16 {median['bfloat16']:.1f} s, "
            f"×{result['speedup']:.2f}; agreement {json.dumps(result['agreement'], default=float)}",
            flush=True,
        )
        if command == "find-heads":
            for dtype in DTYPES:
                r = runs[dtype]
                print(
                    f"  {dtype}: heads {r['selected_heads']}, knockout {r['effect_pct']:.1f} % {r['ci95']}, "
                    f"p {r['random_p']}, {r['conclusion']}"
                )
        if command == "score-binding":
            for dtype in DTYPES:
                print(
                    f"  {dtype}: {json.dumps({k: v for k, v in runs[dtype].items() if k != 'wall_s'}, default=float)}"
                )
    if args.json:
        args.json.write_text(json.dumps(record, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
