#!/usr/bin/env python3
"""Benchmark: the paper's binding-score procedure vs ``surgery score-binding``, same N4 pairs, one run.

    python examples/bench_paper_binding.py [MODEL] [--per-identity 11] [--max-pairs N] [--json FILE]

MODEL defaults to SmolLM2-135M-Instruct where examples/get_models.py puts it; the pairs come from the
N4 JSONL in ../shared/data (or ``$SURGERY_SHARED_DATA``), read at run time — when it or the model
is absent the script says so and exits 0. With the paper's T = 11 per identity our pair builder
makes 844 pairs from N4 (the paper reports 847): 3,376 prompts (match, mismatch and both knowledge
probes).

* ``paper``: what the paper's code does — one prompt per forward pass, eager attention with
  ``output_attentions=True`` (every layer's attention map, from which it reads the per-head
  identity→item features on the binding prompts), full logits; S from the last position.
* ``surgery``: the ``surgery score-binding`` command in a child process, timed from start to exit
  (imports, model load and all: the ratio is conservative for us).

Both read exactly the same token ids (surgery's prompt encoding). The script prints both times,
their ratio and the largest |ΔS| / |ΔK| difference between the two.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from machine import stamp

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = Path.home() / ".cache" / "surgery" / "models" / "smollm2-135m-instruct"


def n4_path() -> Path:
    root = Path(os.environ.get("SURGERY_SHARED_DATA") or REPO.parent / "shared" / "data")
    return root / "difference_awareness" / "N4_1k.jsonl"


def paper_procedure(model_path: Path, n4: Path, per_identity: int, max_pairs: int | None) -> dict:
    """S per prompt, one prompt per pass with every attention map, and ΔS / ΔK as surgery states them."""
    import numpy as np
    import torch

    from surgery.find.heads.benchmark import load_benchmark
    from surgery.find.heads.pairs import build_pairs
    from surgery.find.heads.scores import delta, encode_pairs, option_token_ids, s_scores
    from surgery.model.loading import load_model, load_tokenizer

    tok, model = load_tokenizer(model_path), load_model(model_path)
    model.set_attn_implementation("eager")
    pairs = build_pairs(load_benchmark(n4), seed=0, per_identity=per_identity, max_pairs=max_pairs)
    ids, items, n = option_token_ids(tok), [p.item for p in pairs], len(pairs)
    out = {"pairs": n}
    start = time.perf_counter()
    for probe in ("binding", "knowledge"):
        s = np.zeros(2 * n)
        for i, prompt in enumerate(encode_pairs(tok, pairs, probe)):
            with torch.inference_mode():
                res = model(torch.tensor([prompt.ids]), output_attentions=True)
            if probe == "binding":  # the paper's features: attention mass option tokens → item tokens
                item = list(prompt.spans.get("item", ()))
                for att in res.attentions:
                    for x in ("a", "b"):
                        att[0][:, list(prompt.spans[x])][:, :, item].sum(-1).mean(-1)
            s[i] = s_scores(res.logits[:, -1].float().log_softmax(-1), ids).item()
        out["S" if probe == "binding" else "K"] = delta(s[:n], s[n:], items)
    out["seconds"] = time.perf_counter() - start
    return out


def surgery_command(model_path: Path, n4: Path, per_identity: int, max_pairs: int | None) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "surgery",
        "score-binding",
        str(model_path),
        "--benchmark",
        str(n4),
        "--per-identity",
        str(per_identity),
        "--json",
    ] + (["--max-pairs", str(max_pairs)] if max_pairs else [])
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - start
    if res.returncode:
        raise SystemExit(f"surgery score-binding failed:\n{res.stderr}")
    return {**json.loads(res.stdout), "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--per-identity", type=int, default=11, help="the paper's T (default 11)")
    ap.add_argument("--max-pairs", type=int, default=None, help="a subset, for a quick look")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    n4 = n4_path()
    for what, path in (("N4 data", n4), ("model", args.model)):
        if not path.exists():
            print(f"skipped: no {what} at {path} (python examples/get_models.py gets the models)")
            return 0
    machine = stamp()
    ours = surgery_command(args.model, n4, args.per_identity, args.max_pairs)
    paper = paper_procedure(args.model, n4, args.per_identity, args.max_pairs)
    diff = max(abs(paper[k]["delta"] - ours[k]["delta"]) for k in ("S", "K"))
    report = {
        "machine": machine,
        "model": str(args.model),
        "pairs": paper["pairs"],
        "prompts": 4 * paper["pairs"],
        "paper_s": paper["seconds"],
        "surgery_s": ours["seconds"],
        "ratio": paper["seconds"] / ours["seconds"],
        "max_abs_delta_diff": diff,
        "delta_s": [paper["S"]["delta"], ours["S"]["delta"]],
        "delta_k": [paper["K"]["delta"], ours["K"]["delta"]],
        "threads": os.environ.get("OMP_NUM_THREADS"),
    }
    print(f"{report['pairs']} N4 pairs ({report['prompts']} prompts), {args.model.name}")
    print(f"  paper's procedure (1 prompt/pass, eager, output_attentions, full logits): {paper['seconds']:8.1f} s")
    print(f"  surgery score-binding (whole command, load included):                     {ours['seconds']:8.1f} s")
    print(
        f"  ratio ×{report['ratio']:.1f}; max |ΔS|, |ΔK| difference {diff:.1e} "
        f"(ΔS {paper['S']['delta']:.5f} vs {ours['S']['delta']:.5f})"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
