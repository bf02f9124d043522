"""Benchmark ``surgery eval MODEL --against SOURCE``: cache cold, cache warm, and a naive baseline.

- cold: a fresh cache folder, so the source is measured too (two models);
- warm: the same call again, the source's results read from the cache (one model);
- naive: the straightforward evaluation a user would write with transformers (one item per
  forward pass, full-vocabulary log-softmax everywhere; tests/support/naive_eval.py), once, in a
  child process like the others; the largest relative difference of every number against it is
  printed.

Each eval runs as its own ``python -m surgery`` process (wall and CPU seconds of the child, median
of --runs, cold and warm interleaved). ``--baseline-repo DIR`` also times another checkout's eval
(e.g. a git worktree of an older version) in the same runs.

    OMP_NUM_THREADS=1 python examples/bench_eval.py PRUNED --against SOURCE --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the naive baseline lives in tests/support/
from machine import stamp  # noqa: E402


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one child process; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def eval_cmd(repo: Path, model: str, source: str, out: Path) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "PYTHONPATH": str(repo)}
    return [sys.executable, "-m", "surgery", "eval", model, "--against", source, "--out", str(out)], env


def numbers(result: dict) -> dict[str, float]:
    """The metrics of the model and the source, flat."""
    return {f"{who}/{k}": v for who in ("model", "against") for k, v in result["metrics"][who].items()}


def naive_numbers(model: str, source: str, out: Path) -> list[str]:
    """The command that writes the naive baseline's numbers to ``out``."""
    code = (
        "import json, sys; sys.path.insert(0, %r)\n"
        "from surgery.evaluation.data import retention_data\n"
        "from surgery.model.loading import load_model, load_tokenizer\n"
        "from tests.support.naive_eval import retention_and_kl\n"
        "m, s = load_model(%r), load_model(%r)\n"
        "json.dump(retention_and_kl(m, s, load_tokenizer(%r), retention_data(None)), open(%r, 'w'))\n"
        % (str(REPO), model, source, model, str(out))
    )
    return [sys.executable, "-c", code]


def largest_difference(got: dict[str, float], ref: dict[str, float]) -> tuple[float, str]:
    worst = max(ref, key=lambda k: abs(got[k] - ref[k]) / max(abs(ref[k]), 1e-30))
    return abs(got[worst] - ref[worst]) / max(abs(ref[worst]), 1e-30), worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--against", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--baseline-repo", type=Path, default=None, help="Also time this checkout's eval.")
    ap.add_argument("--no-naive", action="store_true", help="Skip the naive baseline (it takes minutes).")
    ap.add_argument("--json", type=Path, default=None, help="Also write the medians and differences here.")
    args = ap.parse_args()
    machine = stamp()

    times: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
    if args.baseline_repo:
        times["baseline"] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        results = {}
        for run in range(args.runs):
            cache = tmp_path / f"cache-{run}"  # cold: nothing cached yet; warm: the cold run's entry
            for kind in times:
                repo = args.baseline_repo if kind == "baseline" else REPO
                out = tmp_path / f"{kind}-{run}.json"
                cmd, env = eval_cmd(repo, args.model, args.against, out)
                env["SURGERY_CACHE"] = str(cache if kind != "baseline" else tmp_path / f"baseline-cache-{run}")
                times[kind].append(timed(cmd, env))
                results[kind] = json.loads(out.read_text())
                print(
                    f"run {run + 1} {kind}: {times[kind][-1][0]:.1f} s wall, {times[kind][-1][1]:.1f} s CPU",
                    file=sys.stderr,
                )
        assert results["warm"]["against"]["from_cache"] and not results["cold"]["against"]["from_cache"]
        print(
            f"eval {args.model} --against {args.against} (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
            f"median of {args.runs})"
        )
        med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}
        for kind, (wall, cpu) in med.items():
            print(f"  {kind:9s} {wall:7.1f} s wall {cpu:7.1f} s CPU")
        if "baseline" in med:
            for kind in ("cold", "warm"):
                print(
                    f"  baseline / {kind}: {med['baseline'][0] / med[kind][0]:.2f}× wall, "
                    f"{med['baseline'][1] / med[kind][1]:.2f}× CPU"
                )
            print(
                "  largest relative difference, new vs baseline: %.2g (%s)"
                % largest_difference(numbers(results["cold"]), numbers(results["baseline"]))
            )
        same = numbers(results["cold"]) == numbers(results["warm"])
        print(f"  warm numbers identical to cold: {same}")
        report = {
            "machine": machine,
            "model": args.model,
            "against": args.against,
            "runs": args.runs,
            "threads": os.environ.get("OMP_NUM_THREADS"),
            "warm_equals_cold": same,
            **{kind: {"wall_s": wall, "cpu_s": cpu} for kind, (wall, cpu) in med.items()},
        }
        if not args.no_naive:
            out = tmp_path / "naive.json"
            wall, cpu = timed(naive_numbers(args.model, args.against, out), dict(os.environ))
            naive = json.loads(out.read_text())
            diff, worst = largest_difference(numbers(results["cold"]), naive)
            print(f"  naive     {wall:7.1f} s wall {cpu:7.1f} s CPU (one run)")
            print("  largest relative difference, eval vs naive: %.2g (%s)" % (diff, worst))
            report["naive"] = {"wall_s": wall, "cpu_s": cpu, "max_rel_diff": diff, "worst": worst}
        if args.json:
            args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
