#!/usr/bin/env python3
"""Every speed comparison in one run: ours against what a user would otherwise run, as one table.

    python examples/bench_all.py [MODEL] [--only NAME,…] [--quick] [--json FILE] [--markdown FILE]

Each benchmark is its own script under examples/ (run it alone for the details); this one runs
them one after the other, each in a fresh process with ``--json``, and prints one row per
comparison: ours, the alternative, the ratio (a bake: its time over ``cp``'s; the rest: the
speed-up, the alternative's time over ours), whether the two agree, and the command that
reproduces the row. MODEL defaults to SmolLM2-135M-Instruct where
examples/get_models.py puts it; a benchmark whose model, data or extra package is missing says so
and its rows read "skipped". ``--quick`` runs every benchmark small (a smoke run, not numbers to
quote). Ratios are what to read: absolute times on a shared machine swing from hour to hour.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from machine import one_line, stamp

HERE = Path(__file__).resolve().parent
DEFAULT_MODEL = (
    Path(os.environ.get("SURGERY_MODELS", Path.home() / ".cache" / "surgery" / "models")) / "smollm2-135m-instruct"
)

Row = dict[str, str]


@dataclass(frozen=True)
class Bench:
    """One benchmark script: its arguments (full and --quick) and how its JSON becomes table rows."""

    name: str
    script: str
    args: Callable[[Path, bool, Path], list[str]]  # (MODEL, --quick, scratch folder)
    rows: Callable[[dict[str, Any]], list[Row]]
    needs_model: bool = True
    # makes what the benchmark needs besides MODEL (e.g. an edited copy) in the scratch folder
    prepare: Callable[[Path, Path], None] | None = None


def _x(value: float) -> str:
    return f"×{value:.2f}" if value < 10 else f"×{value:.0f}"


def _s(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds < 100 else f"{seconds:.0f} s"


def bake_rows(r: dict[str, Any]) -> list[Row]:
    rows = []
    for m in r["models"].values():  # 1 GB, and 2 GB with --double
        t, gb = m["results"], m["bytes"] / 1e9
        cp = f"`cp -r` {_s(t['cp']['median_s'])}"
        for method, what in (
            ("cli-first", "first bake from a source (`--no-verify`)"),
            ("cli-no-verify", "later bakes (`--no-verify`; source hashes remembered)"),
            ("cli", "with its default check"),
        ):
            rows.append(
                {
                    "what": f"bake {gb:.2f} GB bf16, {what}",
                    "ours": _s(t[method]["median_s"]),
                    "alternative": cp,
                    "ratio": f"{t[method]['ratio_to_cp']:.2f}× cp's time",
                    "agreement": f"peak RSS {t[method]['peak_rss_mb']} MB",
                }
            )
    return rows


def bake_vs_transformers_rows(r: dict[str, Any]) -> list[Row]:
    t = r["models"]["1x"]["results"]
    ours, alt = t["bake"]["median_s"], t["transformers"]["median_s"]
    return [
        {
            "what": f"bake {r['models']['1x']['bytes'] / 1e9:.2f} GB (library call, 40 neurons + 3 heads)",
            "ours": _s(ours),
            "alternative": f"transformers load → edit → `save_pretrained` {_s(alt)}",
            "ratio": f"{_x(alt / ours)} speed-up",
            "agreement": f"peak RSS {t['bake']['peak_rss_mb']} vs {t['transformers']['peak_rss_mb']} MB",
        }
    ]


def capture_rows(r: dict[str, Any]) -> list[Row]:
    return [
        {
            "what": f"find-neurons capture, {r['prompts']} prompts",
            "ours": _s(r["capture_s"]),
            "alternative": f"plain batched forward {_s(r['plain_s'])}",
            "ratio": f"{_x(r['plain_s'] / r['capture_s'])} speed-up",
            "agreement": f"peak RSS at 10× the pairs ×{r['memory_ratio_10x_1x']:.2f}",
        }
    ]


def heads_rows(r: dict[str, Any]) -> list[Row]:
    ours, alt = r["registered"], r["output_attentions"]
    return [
        {
            "what": f"per-head binding features, {r['prompts']} prompts",
            "ours": _s(ours["median_s"]),
            "alternative": f"`output_attentions=True` {_s(alt['median_s'])}",
            "ratio": f"{_x(r['time_ratio'])} speed-up, {_x(r['memory_ratio'])} less extra memory",
            "agreement": f"features differ by at most {r['max_abs_feature_diff']:.1e}",
        }
    ]


def paper_rows(r: dict[str, Any]) -> list[Row]:
    return [
        {
            "what": f"binding scores, {r['pairs']} N4 pairs ({r['prompts']} prompts)",
            "ours": f"`surgery score-binding` {_s(r['surgery_s'])}",
            "alternative": f"paper's procedure (1 prompt/pass, eager, attention maps, full logits) {_s(r['paper_s'])}",
            "ratio": f"{_x(r['ratio'])} speed-up",
            "agreement": f"ΔS and ΔK differ by at most {r['max_abs_delta_diff']:.1e}",
        }
    ]


def optipfair_rows(r: dict[str, Any]) -> list[Row]:
    m, rows = r["median_s"], []
    for site, key in (("down_proj input", "down_proj_input"), ("gate/up outputs", "gate_up_outputs")):
        c = r[key]
        top = "same" if c["top_k_same"] else f"{c['top_k_common']} in common"
        rows.append(
            {
                "what": f"neuron BiasScore at the {site}, {r['pairs']} pairs",
                "ours": _s(m[f"surgery {site}"]),
                "alternative": f"optipfair `analyze_neuron_bias` {_s(m[f'optipfair {site}'])}",
                "ratio": f"{_x(c['ratio'])} speed-up",
                "agreement": f"largest relative score difference {c['max_rel_diff']:.1e}, top-{c['top_k']} {top}",
            }
        )
    return rows


def eval_rows(r: dict[str, Any]) -> list[Row]:
    naive = r.get("naive")
    rows = []
    for kind, label in (("cold", "the source measured too"), ("warm", "the source's results from the cache")):
        ours = r[kind]["cpu_s"]
        rows.append(
            {
                "what": f"`eval PRUNED --against MODEL`, {label} (CPU seconds)",
                "ours": _s(ours),
                "alternative": f"one item per pass, full logits {_s(naive['cpu_s'])}" if naive else "",
                "ratio": f"{_x(naive['cpu_s'] / ours)} speed-up" if naive else "",
                "agreement": (f"numbers differ by at most {naive['max_rel_diff']:.1e} relative" if naive else "")
                + ("; warm equals cold" if r["warm_equals_cold"] else "; WARM DIFFERS"),
            }
        )
    return rows


def _pruned_copy(model: Path, scratch: Path) -> None:
    """A pruned copy of MODEL to evaluate against it (the first 8 neurons of layers 0-4)."""
    neurons = ",".join(f"{layer}:{n}" for layer in range(5) for n in range(8))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "surgery",
            "prune-neurons",
            str(model),
            "--neurons",
            neurons,
            "--out",
            str(scratch / "pruned"),
            "--no-verify",
            "--force",
        ],
        cwd=HERE.parent,
        check=True,
    )


def find_heads_rows(r: dict[str, Any]) -> list[Row]:
    cost = r["cost"]
    return [
        {
            "what": f"find-heads, {r['pairs']['n']} pairs (every pass of the run)",
            "ours": f"{cost['forward_flops']:.2e} FLOPs",
            "alternative": f"one edit per full pass {cost['forward_flops_full_passes']:.2e} FLOPs",
            "ratio": f"{_x(cost['forward_flops_full_passes'] / cost['forward_flops'])} fewer FLOPs",
            "agreement": "same findings (tests/find/heads/test_resume.py)",
        }
    ]


def _find_heads_args(model: Path, quick: bool, scratch: Path) -> list[str]:
    # the FLOP ratio is what this row shows; the quickstart's 96 pairs take ~13 CPU-minutes
    return [str(model)] + (
        ["--max-pairs", "8", "--random-sets", "2"] if quick else ["--max-pairs", "24", "--random-sets", "4"]
    )


BENCHES = [
    Bench(
        "bake",
        "bench_bake.py",
        lambda m, q, s: ["--cli", "--gb", "0.3" if q else "1", "--double", "--runs", "1" if q else "5"],
        bake_rows,
        needs_model=False,
    ),
    Bench(
        "bake-vs-transformers",
        "bench_bake.py",
        lambda m, q, s: ["--gb", "0.3" if q else "1", "--runs", "1" if q else "3"],
        bake_vs_transformers_rows,
        needs_model=False,
    ),
    Bench("capture", "bench_capture.py", lambda m, q, s: [str(m), "--runs", "1" if q else "3"], capture_rows),
    Bench(
        "heads", "bench_heads.py", lambda m, q, s: [str(m), "--runs", "3", "--prompts", "8" if q else "16"], heads_rows
    ),
    Bench(
        "paper-binding",
        "bench_paper_binding.py",
        lambda m, q, s: [str(m), "--max-pairs", "8" if q else "64"],
        paper_rows,
    ),
    Bench(
        "optipfair",
        "bench_optipfair.py",
        lambda m, q, s: [str(m)] + (["--max-pairs", "8", "--runs", "1"] if q else []),
        optipfair_rows,
    ),
    Bench(
        "eval",
        "bench_eval.py",
        lambda m, q, s: (
            [str(s / "pruned"), "--against", str(m), "--runs", "1" if q else "3"] + (["--no-naive"] if q else [])
        ),
        eval_rows,
        prepare=_pruned_copy,
    ),
    Bench("find-heads", "surgery find-heads", _find_heads_args, find_heads_rows),
]


def run_bench(bench: Bench, model: Path, quick: bool, scratch: Path) -> tuple[list[Row], str]:
    """Run one benchmark in a fresh process; its rows (or one "skipped" row) and its command line."""
    out = scratch / f"{bench.name}.json"
    if bench.script.startswith("surgery "):
        cmd = [
            sys.executable,
            "-m",
            "surgery",
            *bench.script.split()[1:],
            *bench.args(model, quick, scratch),
            "--out",
            str(out),
        ]
        shown = " ".join([bench.script, *bench.args(model, quick, scratch)])
    else:
        cmd = [sys.executable, str(HERE / bench.script), *bench.args(model, quick, scratch), "--json", str(out)]
        shown = " ".join(["python", f"examples/{bench.script}", *bench.args(model, quick, scratch)])
    shown = shown.replace(str(scratch / "pruned"), "PRUNED").replace(str(model), "MODEL")
    if bench.needs_model and not model.exists():
        return [
            {"what": bench.name, "ours": "skipped", "alternative": f"no model at {model}", "ratio": "", "agreement": ""}
        ], shown
    print(f"\n== {bench.name}: {shown}", flush=True)
    if bench.prepare is not None:
        bench.prepare(model, scratch)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=HERE.parent)
    print(f"   ({time.perf_counter() - start:.0f} s)", flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"{bench.name} failed (exit {proc.returncode}): {' '.join(cmd)}")
    if not out.exists():  # the script found its model, data or package missing and said so
        return [
            {"what": bench.name, "ours": "skipped", "alternative": "see its output above", "ratio": "", "agreement": ""}
        ], shown
    return bench.rows(json.loads(out.read_text())), shown


def markdown(rows: list[tuple[Row, str]]) -> str:
    lines = ["| what | ours | the alternative | ratio | agreement / memory | reproduce |", "|---|---|---|---|---|---|"]
    for row, cmd in rows:
        lines.append(
            f"| {row['what']} | {row['ours']} | {row['alternative']} | {row['ratio']} | {row['agreement']} | `{cmd}` |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--only", default="", help=f"comma-separated subset of {', '.join(b.name for b in BENCHES)}")
    ap.add_argument("--quick", action="store_true", help="small runs: a smoke test, not numbers to quote")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    args = ap.parse_args(argv)
    chosen = [b for b in BENCHES if not args.only or b.name in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - {b.name for b in BENCHES}
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(sorted(unknown))}; choose from {', '.join(b.name for b in BENCHES)}")
    machine = stamp()
    rows: list[tuple[Row, str]] = []
    with tempfile.TemporaryDirectory(prefix="surgery-bench-all-") as scratch:
        for bench in chosen:
            got, cmd = run_bench(bench, args.model, args.quick, Path(scratch))
            rows += [(r, cmd) for r in got]
    load = os.getloadavg()[0]
    table = markdown(rows)
    print(
        f"\n{one_line(machine)}, Python {platform.python_version()}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, load average {load:.1f} at the end"
        + (" — --quick: smoke-run numbers, not to quote" if args.quick else "")
        + "\n"
    )
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(json.dumps([{**r, "command": c} for r, c in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
