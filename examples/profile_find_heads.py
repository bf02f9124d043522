#!/usr/bin/env python3
"""Phase-by-phase wall and CPU time of `surgery find-heads`, run in-process with the CLI's options.

    OMP_NUM_THREADS=1 python examples/profile_find_heads.py MODEL --max-pairs 96 --random-sets 10 \
        --out heads.json [--profile-json phases.json]

Every option but ``--profile-json`` goes to ``surgery find-heads`` unchanged; ``--recompute`` is
added (a cached result would time nothing). Each phase is one library call that find_heads makes
(wrapped by name in ``surgery.find.heads.find``), so the phases add up to the command minus the CLI
start-up, pair building and printing (reported as "other").
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from machine import stamp

from surgery.cli import main as surgery_command
from surgery.find import findings as findings_mod
from surgery.find.heads import awareness as awareness_mod
from surgery.find.heads import causal as causal_mod
from surgery.find.heads import find as find_mod
from surgery.find.heads import scores as scores_mod

PHASES: dict[str, list[float]] = {}


ACTIVE: list[str] = []  # the phase being timed: a wrapped call inside it is part of it


@contextmanager
def timed(name: str) -> Iterator[None]:
    if ACTIVE:
        yield
        return
    ACTIVE.append(name)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        ACTIVE.pop()
        acc = PHASES.setdefault(name, [0.0, 0.0, 0])
        acc[0] += time.perf_counter() - wall
        acc[1] += time.process_time() - cpu
        acc[2] += 1


def wrap(module: Any, attr: str, name: str | Callable[..., str]) -> None:
    """Time every call of ``module.attr`` under ``name`` (or ``name(*args, **kwargs)``)."""
    inner = getattr(module, attr)

    def outer(*args, **kwargs):
        with timed(name(*args, **kwargs) if callable(name) else name):
            return inner(*args, **kwargs)

    setattr(module, attr, outer)


def main(argv: list[str]) -> None:
    out_json = None
    if "--profile-json" in argv:
        i = argv.index("--profile-json")
        out_json = argv[i + 1]
        argv = argv[:i] + argv[i + 2 :]
    wrap(find_mod, "load_tokenizer", "model load")
    wrap(find_mod, "load_model", "model load")
    wrap(find_mod, "flops_note", "FLOP count")
    # score_binding runs the binding prompts with features (the capture) and the knowledge prompts
    wrap(
        scores_mod,
        "run_prompts",
        lambda *a, **k: (
            "baseline + attention-feature capture (binding)" if k.get("features") else "baseline scores (knowledge)"
        ),
    )
    wrap(find_mod, "discover", "L1 discovery")
    wrap(find_mod, "confirmation", "single-head confirmations")
    wrap(find_mod, "knockout_report", "knockout report + random sets")
    wrap(find_mod, "dose_response", "dose response (edge + whole-head)")
    # with --dose-response find_heads sweeps the knockouts and the dose-response together first
    wrap(causal_mod.PairRunner, "prefetch", "knockouts + dose response, one shared sweep")
    wrap(awareness_mod, "awareness_at", "awareness / knowledge probe (generation)")
    wrap(find_mod, "save_findings", "writing")
    wrap(findings_mod, "save_findings", "writing")  # the CLI's --out (imported at call time)

    machine = stamp()
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        try:  # the `surgery` command itself, in this process
            surgery_command(["find-heads", *argv, "--recompute"])
        except SystemExit as exc:
            if exc.code:
                raise
    finally:
        total = [time.perf_counter() - wall, time.process_time() - cpu]
        named = [sum(v[0] for v in PHASES.values()), sum(v[1] for v in PHASES.values())]
        PHASES["other (CLI, pairs, encoding, printing)"] = [total[0] - named[0], total[1] - named[1], 1]
        PHASES["total"] = [*total, 1]
        print("\nphase\twall_s\tcpu_s\tcalls", file=sys.stderr)
        for name, (w, c, n) in PHASES.items():
            print(f"{name}\t{w:.1f}\t{c:.1f}\t{n}", file=sys.stderr)
        if out_json:
            with open(out_json, "w") as f:
                json.dump({"machine": machine, "phases": PHASES}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
