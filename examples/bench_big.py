#!/usr/bin/env python3
"""Benchmark at real scale: bake (and verify) a checkpoint with a real model's shapes, against `cp`.

    python examples/bench_big.py [--shape llama-3.1-8b|gpt-oss-20b] [--layers N] [--runs 1] [--scratch DIR] [--json FILE]

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

``--shape gpt-oss-20b`` builds gpt-oss-20b's shapes with its experts in MXFP4 as the release stores them
(12 layers: 8.0 GB; all 24: 13.8 GB) and times, the same way, ``cp -r`` against one recipe (40 routed
experts' neurons pruned over the layers, two heads × 2) baked with every edited block checked by
transformers' MXFP4 decoder: as the library call (``surgery.api.apply``, its imports and the call timed
apart) and as ``surgery apply RECIPE --model SRC --out DST``. Each ratio to ``cp`` is the median of the
runs' ratios (each against the ``cp`` of its own run).
"""

from __future__ import annotations

import argparse
import json
import os
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
from synthetic_checkpoint import SHAPES, build  # noqa: E402

GB = 1e9


def neurons(layers: int, n: int = 40) -> str:
    """40 neurons spread over the layers (deterministic)."""
    return ",".join(f"{(7 * i) % layers}:{(1009 * i + 17) % 14336}" for i in range(n))


def moe_recipe(cfg: dict, n: int = 40) -> str:
    """A recipe (YAML) for gpt-oss: ``n`` routed experts' neurons pruned, spread over layers and experts
    (deterministic), and two heads × 2 (a power of two, as amplify-heads --alpha 2)."""
    layers, experts, width = cfg["num_hidden_layers"], cfg["num_local_experts"], cfg["intermediate_size"]
    edits = [
        f"  - {{type: neuron, layer: {(3 * i) % layers}, expert: {(5 * i + 1) % experts}, "
        f"neuron: {(613 * i + 11) % width}, factor: 0}}"
        for i in range(n)
    ]
    heads = cfg["num_attention_heads"]
    edits += [
        f"  - {{type: head, layer: {layer}, head: {h % heads}, alpha: 2}}" for layer, h in ((1, 5), (layers - 2, 40))
    ]
    return "version: 1\nedits:\n" + "\n".join(edits) + "\n"


def child(src: str, recipe: str, dst: str) -> None:
    """The library call, measured: ``surgery.api.apply`` (its default check) with its imports timed apart."""
    started = time.perf_counter()
    from surgery.api import apply

    imported = time.perf_counter()
    apply(recipe, src, dst)
    print(json.dumps({"imports_s": imported - started, "call_s": time.perf_counter() - imported}))


def timed(cmd: list[str]) -> dict:
    started = time.perf_counter()
    res, peak = run_measured(cmd)
    wall = time.perf_counter() - started
    if res.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{res.stderr[-3000:]}")
    row = {"wall_s": wall, "rss_gb": peak.rss_bytes / GB, "anon_gb": peak.anon_bytes / GB}
    lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
    return {**row, **json.loads(lines[-1])} if lines and "call_s" in lines[-1] else row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    ap.add_argument("--layers", type=int, default=None, help="depth (default: the real model's)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/surgery-bench-big"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", nargs=3, metavar=("SRC", "RECIPE", "DST"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    machine = stamp()  # prints the machine line
    layers = args.layers or SHAPES[args.shape]["num_hidden_layers"]
    args.scratch.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    src = build(
        args.scratch / f"{args.shape}-shapes-{layers}l",
        args.shape,
        layers=layers,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    print(
        f"checkpoint: {size / GB:.2f} GB, {args.shape} shapes, {layers} layers (built/reused in {time.perf_counter() - started:.0f} s)",
        flush=True,
    )
    dst = args.scratch / "out"
    surgery = [sys.executable, "-m", "surgery"]
    if args.shape == "gpt-oss-20b":
        recipe = args.scratch / "recipe.yaml"
        recipe.write_text(moe_recipe(json.loads((src / "config.json").read_text())))
        methods = {
            "cp -r": ["cp", "-r", str(src), str(dst)],
            "apply (library call)": [sys.executable, __file__, "--child", str(src), str(recipe), str(dst)],
            "surgery apply (CLI)": [*surgery, "apply", str(recipe), "--model", str(src), "--out", str(dst)],
        }
    else:
        bake = [*surgery, "prune-neurons", str(src), "--neurons", neurons(layers), "--out", str(dst)]
        methods = {
            "cp -r": ["cp", "-r", str(src), str(dst)],
            "prune-neurons --no-verify": [*bake, "--no-verify"],
            "prune-neurons (default check, bf16)": [*bake, "--dtype", "bfloat16"],
        }
    verified = "prune-neurons (default check, bf16)" in methods
    results: dict[str, list[dict]] = {name: [] for name in [*methods, *(["verify (bf16)"] if verified else [])]}

    def record(run: int, name: str, cmd: list[str]) -> None:
        results[name].append(timed(cmd))
        r = results[name][-1]
        call = f"  (imports {r['imports_s']:.1f} s, call {r['call_s']:.1f} s)" if "call_s" in r else ""
        print(
            f"run {run + 1} {name:38s} {r['wall_s']:7.1f} s  RSS {r['rss_gb']:5.2f} GB  anon {r['anon_gb']:5.2f} GB"
            f"{call}  load {os.getloadavg()[0]:.2f}",
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
    cps = [r["wall_s"] for r in results["cp -r"]]
    print(f"\nmedians of {args.runs} run(s), {size / GB:.1f} GB {args.shape} checkpoint, load {os.getloadavg()}")
    print(f"{'command':40s} {'wall':>8s} {'× cp':>6s} {'peak RSS':>9s} {'anon':>7s}")
    summary = {}
    for name, rows in results.items():
        wall = statistics.median(r["wall_s"] for r in rows)
        x_cp = statistics.median(r["wall_s"] / cp for r, cp in zip(rows, cps, strict=True))  # each run's own cp
        rss, anon = max(r["rss_gb"] for r in rows), max(r["anon_gb"] for r in rows)
        summary[name] = {"wall_s": wall, "x_cp": x_cp, "peak_rss_gb": rss, "peak_anon_gb": anon}
        call = ""
        if "call_s" in rows[0]:
            call_s = statistics.median(r["call_s"] for r in rows)
            summary[name] |= {
                "call_s": call_s,
                "call_x_cp": statistics.median(r["call_s"] / cp for r, cp in zip(rows, cps)),
            }
            call = f"  the call alone {call_s:.1f} s = {summary[name]['call_x_cp']:.2f}× cp"
        print(f"{name:40s} {wall:7.1f}s {x_cp:5.2f}× {rss:7.2f} GB {anon:5.2f} GB{call}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"machine": machine, "size_gb": size / GB, "runs": args.runs, "results": results, "summary": summary},
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
