#!/usr/bin/env python3
"""Benchmark: binding-feature extraction, registered attention function vs output_attentions=True.

    python examples/bench_heads.py MODEL [--prompts 16] [--batch-size 8] [--runs 3] [--json FILE]

Both methods compute the same per-(layer, head) features (bind_a, bind_b of docs/methods/binding-heads.md) on the
same binding prompts of the shipped benchmark:

* ``registered``: surgery's attention function keeps only the (B, 2, H) aggregates of each layer
  while the forward pass runs;
* ``output_attentions``: eager attention returns every layer's full (B, H, T, T) map, and the
  features are computed from those maps afterwards — the straightforward approach.

Time and peak memory are measured in the same process after the model is loaded and warmed up:
the peak resident set (VmHWM) is reset through /proc/self/clear_refs before each run, so a run's
peak minus the resident set before it is the extra memory the method needs. Runs alternate between
the methods; the median of ``--runs`` is reported, with the ratio output_attentions / registered.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from machine import stamp

from surgery.find.heads.attention import AttentionPlan, active_plan, surgery_attention_on
from surgery.find.heads.benchmark import load_benchmark
from surgery.find.heads.pairs import build_pairs
from surgery.find.heads.prompts import batches
from surgery.find.heads.scores import SPAN_NAMES, encode_pairs
from surgery.model.loading import load_model, load_tokenizer


def _status(key: str) -> int:
    """A VmRSS / VmHWM line of /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status (Linux only)")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # "5" resets VmHWM to the current RSS


def registered(model, prompts, batch_size: int, pad: int) -> np.ndarray:
    layers = model.config.num_hidden_layers
    out = []
    with surgery_attention_on(model):
        for batch in batches(prompts, batch_size, pad, SPAN_NAMES):
            plan = AttentionPlan(batch.masks, features=True)
            with torch.inference_mode(), active_plan(plan):
                model(**batch.model_inputs(), use_cache=False, logits_to_keep=1)
            out.append((batch.index, plan.features_tensor(layers).numpy()))
    return _order(out, len(prompts))


def with_maps(model, prompts, batch_size: int, pad: int) -> np.ndarray:
    model.set_attn_implementation("eager")
    out = []
    for batch in batches(prompts, batch_size, pad, SPAN_NAMES):
        with torch.inference_mode():
            maps = model(**batch.model_inputs(), use_cache=False, logits_to_keep=1, output_attentions=True).attentions
        m = batch.masks
        item = m["item"].float()
        feats = []
        for att in maps:  # (B, H, T, T) per layer, all held at once
            to_item = torch.einsum("bhqk,bk->bhq", att.float(), item)
            per = [
                torch.einsum("bhq,bq->bh", to_item, m[x].float()) / m[x].float().sum(-1).clamp(min=1)[:, None]
                for x in ("a", "b")
            ]
            feats.append((per[0] + per[1]) / 2)
        out.append((batch.index, torch.stack(feats, 1).numpy()))
    return _order(out, len(prompts))


def _order(parts, n: int) -> np.ndarray:
    full = None
    for index, f in parts:
        if full is None:
            full = np.zeros((n,) + f.shape[1:], dtype=np.float32)
        full[list(index)] = f
    return full


def measure(fn, *args) -> tuple[float, int, np.ndarray]:
    """(seconds, extra peak bytes, result) of one call."""
    before = _status("VmRSS")
    _reset_peak()
    t = time.perf_counter()
    res = fn(*args)
    return time.perf_counter() - t, _status("VmHWM") - before, res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ and argv is None:
        # glibc raises its mmap threshold after the first large free, so later big buffers come from
        # the heap and stay resident after use: the next method's peak would hide inside them (it
        # read +0.0 MB). A fixed threshold returns every large buffer to the system when freed.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})
    if args.runs < 3:
        ap.error("--runs must be ≥ 3 (the median is reported)")
    machine = stamp()
    if args.threads:
        torch.set_num_threads(args.threads)
    tok, model = load_tokenizer(args.model), load_model(args.model)
    pairs = build_pairs(load_benchmark("builtin"), seed=0, max_pairs=max(2, args.prompts // 2))
    prompts = encode_pairs(tok, pairs, "binding")[: args.prompts]
    pad = tok.pad_token_id or 0
    methods = {"registered": registered, "output_attentions": with_maps}
    for fn in methods.values():  # warm-up: first-call allocations and lazy imports are not measured
        fn(model, prompts[: args.batch_size], args.batch_size, pad)
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in methods}
    results = {}
    for _ in range(args.runs):
        for name, fn in methods.items():
            sec, peak, res = measure(fn, model, prompts, args.batch_size, pad)
            runs[name].append((sec, peak))
            results[name] = res
    diff = float(np.abs(results["registered"] - results["output_attentions"]).max())
    report = {
        "machine": machine,
        "model": args.model,
        "prompts": len(prompts),
        "batch_size": args.batch_size,
        "runs": args.runs,
        "tokens_per_prompt": statistics.median(len(p.ids) for p in prompts),
        "max_abs_feature_diff": diff,
        "threads": torch.get_num_threads(),
    }
    for name in methods:
        report[name] = {
            "median_s": statistics.median(s for s, _ in runs[name]),
            "median_peak_extra_mb": statistics.median(m for _, m in runs[name]) / 2**20,
            "runs_s": [s for s, _ in runs[name]],
        }
    r, o = report["registered"], report["output_attentions"]
    report["time_ratio"] = o["median_s"] / r["median_s"]
    # below 1 MB the peak is within measurement noise (page granularity, allocator slack)
    report["memory_ratio"] = o["median_peak_extra_mb"] / max(r["median_peak_extra_mb"], 1.0)
    print(
        f"{len(prompts)} prompts (median {report['tokens_per_prompt']} tokens), batch {args.batch_size}, "
        f"median of {args.runs} runs; features agree to {diff:.1e}"
    )
    for name in methods:
        print(f"  {name:<18} {report[name]['median_s']:8.2f} s   peak +{report[name]['median_peak_extra_mb']:8.1f} MB")
    print(f"  output_attentions / registered: time ×{report['time_ratio']:.2f}, memory ×{report['memory_ratio']:.1f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
