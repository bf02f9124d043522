#!/usr/bin/env python3
"""Benchmark: find-heads (screened, the default) against --exhaustive on the same model and pairs.

    OMP_NUM_THREADS=2 python examples/bench_screening.py MODEL --max-pairs 96 --random-sets 10 [--json FILE]

Both procedures run in this process, one after the other, with a fresh findings cache
(``--recompute``). For each it prints the FLOPs as a share of the exhaustive procedure's full passes
(findings["cost"]: forward and the screen's backward), the wall time, the selected heads, the
selection's knockout effect with its 95% CI, the random-set baseline's p-value (how many sets ran
and why they stopped) and the conclusion: "effect" where the CI lies above 0 and p ≤ the level,
"none" otherwise. Then the Spearman rank correlation of screened and exact single-head effects:
over the heads the screened run knocked out alone, and over the exhaustive run's candidates (its
exact effects against the screened run's estimates of the same heads).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from machine import stamp

import surgery
from surgery.find.heads.record import HeadsFindings
from surgery.find.heads.screen import spearman


def _ci(ci: list | None) -> str:
    lo, hi = (list(ci or []) + [None, None])[:2]
    return "[—]" if lo is None or (isinstance(lo, float) and math.isnan(lo)) else f"[{lo:.1f}, {hi:.1f}]"


def conclusion(f: HeadsFindings, level: float) -> str:
    """ "effect" where the selection's knockout CI lies above 0 and the random-set p ≤ ``level``."""
    tested, rnd = f.knockout.tested, f.knockout.random
    above = tested.ci95 is not None and tested.ci95[0] is not None and tested.ci95[0] > 0
    if above and rnd.p is not None and rnd.p <= level:
        return "effect"
    reasons = [] if above else ["CI not above 0"]
    if rnd.p is None or rnd.p > level:
        reasons.append(f"random-set p {rnd.p:.3f} > {level:g}")
    return "none (" + ", ".join(reasons) + ")"


def summary(f: HeadsFindings, wall: float, level: float) -> dict[str, Any]:
    cost, rnd, conf = f.cost, f.knockout.random, f.confirmation
    return {
        "flops": cost["forward_flops"] + cost.get("backward_flops", 0),
        "flops_full_passes": cost["forward_flops_full_passes"],
        "share_of_full_passes": (cost["forward_flops"] + cost.get("backward_flops", 0))
        / cost["forward_flops_full_passes"],
        "wall_s": wall,
        "selected_heads": f.selected_heads,
        "confirmed": conf.candidates if conf else 0,
        "effect_pct": f.knockout.tested.effect_pct,
        "ci95": f.knockout.tested.ci95,
        "random_sets_run": rnd.n,
        "random_p": rnd.p,
        "random_stopped": rnd.stopped,
        "conclusion": conclusion(f, level),
        "spearman": conf.spearman if conf else None,
    }


def cross_spearman(screened: HeadsFindings, exhaustive: HeadsFindings) -> float:
    """Spearman of the screened run's estimates and the exhaustive run's exact single-head effects."""
    estimate = {(h.layer, h.head): h.effect_pct for h in screened.screen.heads}
    exact = [(estimate[(h.layer, h.head)], h.effect_pct) for h in exhaustive.confirmation.heads]
    return spearman([e for e, _ in exact], [x for _, x in exact])


def phases(model: str, found: dict[str, HeadsFindings], batch_size: int) -> dict[str, dict[str, float]]:
    """Each run's FLOPs by phase, in full passes over the binding prompts (Counter's formulas: what
    the run counted, every knockout priced as a resumed sweep that changes every batch)."""
    from surgery.api.heads import _pairs
    from surgery.find.heads.flops import Counter
    from surgery.find.heads.params import FindParams
    from surgery.find.heads.scores import encode_pairs
    from surgery.model.loading import load_model, load_tokenizer

    first = next(iter(found.values()))  # both runs measured the same pairs
    fields = FindParams().to_dict().keys()
    _, pairs = _pairs(FindParams(**{k: v for k, v in (first.parameters or {}).items() if k in fields}))
    tokenizer, instruct = load_tokenizer(model), first.prompt_format == "instruct"
    counter, b = Counter.of(load_model(model)), batch_size
    binding, knowledge = (encode_pairs(tokenizer, pairs, probe, instruct) for probe in ("binding", "knowledge"))
    full = counter.full(binding, b)

    def knockout(heads: list, span: str = "tested") -> int:
        return counter.resumed(binding, b, span, min(layer for layer, _ in heads))

    out = {}
    for name, f in found.items():
        screened = f.screen is not None
        flops = {
            "scoring": full,
            "knowledge probe": counter.shared(knowledge, b),
            "screen forward": counter.screen_forward(binding, b) if screened else 0,
            "screen backward": counter.backward(binding, b) if screened else 0,
            "confirmations": sum(knockout([(h.layer, h.head)]) for h in f.confirmation.heads),
            "selection + control": knockout(f.selected_heads) + knockout(f.selected_heads, "control"),
            "random sets": sum(knockout(r.heads) for r in f.knockout.random_sets),
            "denominator": f.cost["forward_flops_full_passes"],
        }
        out[name] = {k: v / full for k, v in flops.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--max-pairs", type=int, default=96)
    ap.add_argument("--random-sets", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--level", type=float, default=0.05)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument(
        "--findings", type=Path, default=None, help="also write both findings here (screened.json, exhaustive.json)"
    )
    args = ap.parse_args(argv)
    record: dict[str, Any] = {
        "machine": stamp(),
        "model": args.model,
        "options": vars(args) | {"json": None, "findings": None},
    }
    options = dict(max_pairs=args.max_pairs, random_sets=args.random_sets, batch_size=args.batch_size, level=args.level)
    found = {}
    for name, screen in (("screened", True), ("exhaustive", False)):
        start = time.perf_counter()
        out = args.findings / f"{name}.json" if args.findings else None
        f = surgery.find_heads(args.model, recompute=True, exhaustive=not screen, out=out, **options).data
        record[name] = summary(f, time.perf_counter() - start, args.level)
        found[name] = f
    record["spearman_screen_vs_exhaustive"] = cross_spearman(found["screened"], found["exhaustive"])
    for name, split in phases(args.model, found, args.batch_size).items():
        record[name]["phases_full_passes"] = split
    for name in ("screened", "exhaustive"):
        r = record[name]
        heads = ", ".join(f"{layer}.{head}" for layer, head in r["selected_heads"])
        print(
            f"{name:>10}: {r['share_of_full_passes']:.3f} of full-pass FLOPs ({r['flops']:.3e} of "
            f"{r['flops_full_passes']:.3e}), {r['wall_s']:.0f} s wall; {r['confirmed']} heads knocked out alone; "
            f"selected {heads}; knockout {r['effect_pct']:.1f} % {_ci(r['ci95'])}; random sets {r['random_sets_run']} "
            f"({r['random_stopped']}), p {r['random_p']:.3f}; {r['conclusion']}"
        )
        parts = ", ".join(f"{k} {v:.2f}" for k, v in r["phases_full_passes"].items() if k != "denominator")
        print(f"{'':>10}  in binding full passes of {r['phases_full_passes']['denominator']:.1f}: {parts}")
    print(
        f"Spearman of screened and exact single-head effects: {record['screened']['spearman']:.2f} over the "
        f"screened run's {record['screened']['confirmed']} heads, {record['spearman_screen_vs_exhaustive']:.2f} "
        f"over the exhaustive run's {record['exhaustive']['confirmed']}"
    )
    print(
        f"same selection: {record['screened']['selected_heads'] == record['exhaustive']['selected_heads']}; "
        f"FLOPs ×{record['screened']['flops'] / record['exhaustive']['flops']:.2f}, "
        f"wall ×{record['screened']['wall_s'] / record['exhaustive']['wall_s']:.2f} (screened / exhaustive)"
    )
    if args.json:
        args.json.write_text(json.dumps(record, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
