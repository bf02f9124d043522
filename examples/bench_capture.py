"""Benchmark the neuron capture behind find-neurons against a plain batched forward pass.

Time: the capture of every pair (tokenize, forward with down_proj hooks and early exit, streaming
sums) versus a plain ``model(input_ids, attention_mask)`` over the same prompts with the same
batches; median of --runs runs each, interleaved. Memory: peak resident memory while capturing 1×
and 10× the pairs, each in a fresh process (the model's own memory is reported separately).

    python examples/bench_capture.py ~/.cache/surgery/models/smollm2-135m-instruct --runs 3 [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from machine import stamp

from surgery.find.neurons.pairs import check_token_counts, load_pairs
from surgery.find.neurons.scores import accumulate_pair_sums
from surgery.model.loading import load_model, load_tokenizer


def _rss() -> int:
    """Resident memory of this process in bytes (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """Sample the resident memory every 5 ms while the block runs."""

    def __enter__(self) -> PeakRss:
        self.peak, self._stop = _rss(), threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def plain_forward(model, tok, texts: list[str], batch: int) -> None:
    """What any user would run: tokenize, pad, full forward (lm_head included), no hooks."""
    with torch.inference_mode():
        for start in range(0, len(texts), batch):
            enc = tok(texts[start : start + batch], return_tensors="pt", padding=True, padding_side="right")
            model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], use_cache=False)


def setup(args):
    model, tok = load_model(args.model), load_tokenizer(args.model)
    pairs = check_token_counts(load_pairs(args.pairs, args.language), tok).kept.pairs
    return model, tok, list(pairs)


def child_memory(args) -> None:
    """One fresh process: peak RSS while capturing ``--repeat`` × the pairs."""
    model, tok, pairs = setup(args)
    pairs = pairs * args.repeat
    accumulate_pair_sums(model, tok, pairs[: args.batch_size], args.batch_size)  # warm-up allocations
    before = _rss()
    with PeakRss() as peak:
        accumulate_pair_sums(model, tok, pairs, args.batch_size)
    print(json.dumps({"pairs": len(pairs), "rss_before": before, "peak": peak.peak}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--pairs", default="builtin")
    ap.add_argument("--language", default=None)
    ap.add_argument("--batch-size", type=int, default=16, help="Pairs per forward pass (2 prompts each).")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="Also write the results here.")
    ap.add_argument("--child-repeat", dest="repeat", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.repeat:
        child_memory(args)
        return
    machine = stamp()

    model, tok, pairs = setup(args)
    texts = [t for p in pairs for t in (p.prompt_1, p.prompt_2)]
    plain_forward(model, tok, texts[: 2 * args.batch_size], 2 * args.batch_size)  # warm-up
    capture_s, plain_s = [], []
    for _ in range(args.runs):
        t = time.perf_counter()
        accumulate_pair_sums(model, tok, pairs, args.batch_size)
        capture_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        plain_forward(model, tok, texts, 2 * args.batch_size)
        plain_s.append(time.perf_counter() - t)
    cap, plain = statistics.median(capture_s), statistics.median(plain_s)
    print(
        f"{len(pairs)} pairs ({len(texts)} prompts), batch {args.batch_size} pairs, {args.threads} threads, "
        f"median of {args.runs}"
    )
    print(f"capture (find-neurons forward)  {cap:7.2f} s   runs {', '.join(f'{x:.2f}' for x in capture_s)}")
    print(f"plain batched forward           {plain:7.2f} s   runs {', '.join(f'{x:.2f}' for x in plain_s)}")
    print(f"ratio capture / plain           {cap / plain:7.3f}   (target ≤ 1.15)")

    mem = {}
    for repeat in (1, 10):
        cmd = [
            sys.executable,
            __file__,
            str(args.model),
            "--pairs",
            args.pairs,
            "--batch-size",
            str(args.batch_size),
            "--threads",
            str(args.threads),
            "--child-repeat",
            str(repeat),
        ]
        cmd += ["--language", args.language] if args.language else []
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        mem[repeat] = json.loads(res.stdout.strip().splitlines()[-1])
    mib = 1 << 20
    for repeat, m in mem.items():
        print(
            f"peak RSS {repeat:>2}× pairs ({m['pairs']:>5}): {m['peak'] / mib:8.1f} MiB  "
            f"(+{(m['peak'] - m['rss_before']) / mib:.1f} MiB over the loaded model)"
        )
    print(f"peak ratio 10× / 1×             {mem[10]['peak'] / mem[1]['peak']:7.3f}   (target: flat)")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": machine,
                    "model": str(args.model),
                    "pairs": len(pairs),
                    "prompts": len(texts),
                    "threads": args.threads,
                    "runs": args.runs,
                    "capture_s": cap,
                    "plain_s": plain,
                    "capture_runs_s": capture_s,
                    "plain_runs_s": plain_s,
                    "time_ratio": cap / plain,
                    "peak_rss_mib": {str(r): m["peak"] / mib for r, m in mem.items()},
                    "memory_ratio_10x_1x": mem[10]["peak"] / mem[1]["peak"],
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
