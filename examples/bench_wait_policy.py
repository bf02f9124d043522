#!/usr/bin/env python3
"""How OpenMP's thread settings change torch's CPU speed on a quiet and on a busy machine.

    python examples/bench_wait_policy.py [MODEL] [--questions 120] [--busy 0 2] [--runs 3] [--json FILE]

torch's CPU kernels run on OpenMP threads (GNU libgomp in the PyPI wheels), one per core. Between two
parallel regions libgomp's threads spin, waiting for work, before they sleep, and a small model's
forward pass is hundreds of short regions. When other jobs hold the cores, a spinning thread takes a
core from the thread that has the work, and every region's barrier waits for a thread the kernel has
not scheduled. ``OMP_WAIT_POLICY=PASSIVE`` makes waiting threads sleep at once; ``OMP_NUM_THREADS=1``
has no barrier at all.

Each run starts a fresh child process per arm (both are read when the OpenMP runtime starts),
interleaved: the child loads MODEL in float32 and times surgery's multiple-choice log-likelihoods
(``evaluation.lm.option_logliks``, the eval's retention questions) over the first ``--questions``
questions. Arms: torch's defaults, ``OMP_WAIT_POLICY=PASSIVE``, ``OMP_NUM_THREADS=1``; each with 0 or
more busy processes (pure Python loops) started beside the child to stand for other jobs. Printed per
busy count: each arm's median seconds and its ratio to the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import stamp  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = Path.home() / ".cache/surgery/models/smollm2-135m-instruct"
# Each arm's environment for the child, over the caller's (OMP_* variables removed first).
ARMS = {"default": {}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"}, "1-thread": {"OMP_NUM_THREADS": "1"}}

CHILD = r"""
import json, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from surgery.evaluation import lm

model_dir, n = sys.argv[1], int(sys.argv[2])
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
questions = [json.loads(line) for line in open(sys.argv[3])][:n]
pairs = [(f"Question: {q['question']}\nAnswer:", f" {c}") for q in questions for c in q["choices"]]
start = time.perf_counter()
lm.option_logliks(model, tok, pairs, batch_size=32)
print(json.dumps({"seconds": time.perf_counter() - start, "threads": torch.get_num_threads()}))
"""


def run_arm(model: Path, questions: int, arm: dict[str, str], busy: int) -> dict:
    """One child run with ``arm``'s environment and ``busy`` spinning processes beside it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    env.update(arm, PYTHONPATH=str(REPO))
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(model), str(questions), str(REPO / "surgery/data/mcq_general.jsonl")],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--questions", type=int, default=120)
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    machine = stamp()
    seconds: dict[tuple[int, str], list[float]] = {}
    for run in range(args.runs):
        for busy in args.busy:
            # alternate the arms' order, so a drift in the machine's load favours none
            order = list(ARMS) if run % 2 == 0 else list(reversed(ARMS))
            for name in order:
                got = run_arm(args.model, args.questions, ARMS[name], busy)
                seconds.setdefault((busy, name), []).append(got["seconds"])
                print(
                    f"run {run + 1} busy {busy} {name:9s} {got['seconds']:7.2f} s on {got['threads']} threads "
                    f"(load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
    summary = []
    for busy in args.busy:
        median = {n: statistics.median(seconds[(busy, n)]) for n in ARMS}
        summary.append({"busy": busy, "median_s": median})
        ratios = ", ".join(f"{n} {median[n]:.2f} s ({median[n] / median['default']:.2f}×)" for n in ARMS)
        print(f"busy {busy}: {ratios}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
