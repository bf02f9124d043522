#!/usr/bin/env python3
"""The GPU check: throughput and memory at Llama-3.1-8B shapes in bf16, and bf16-on-device findings
equal to CPU float32 findings on the shipped planted fixtures. Needs nothing from the network.

    python examples/gpu_check.py [--device auto] [--layers 32] [--scratch DIR] [--json FILE]

1. Planted fixtures (tests/fixtures): ``surgery find-neurons`` on bias_model and ``surgery
   find-heads`` on binding_model, once on the CPU in float32 and once on ``--device`` in bfloat16
   (fresh caches); the selected neurons (top ``--neurons``) and heads must be the same.
2. A random checkpoint with Llama-3.1-8B's shapes (examples/synthetic_checkpoint.py, ``--layers``
   deep, 16 GB at 32) loaded on ``--device`` in bfloat16: prompts per second of the find-neurons
   capture (BiasScore pairs) and of score-binding (match/mismatch prompts), and peak device memory.

On a machine without a GPU it runs on the CPU as a smoke test (``--device cpu --layers 1``, as CI
does); the README's "Big models" section quotes the numbers of a GPU run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
FIXTURES = ROOT / "tests" / "fixtures"


def cli(*args: object, env: dict[str, str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "surgery", *map(str, args)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"failed: surgery {' '.join(map(str, args))}\n{res.stderr[-2000:]}")
    return res


def planted_agreement(device: str, neurons: int, scratch: Path) -> dict:
    """Selections of CPU float32 and of ``device`` bfloat16 on the planted fixtures."""
    out: dict = {}
    runs = {"cpu float32": ("cpu", "float32"), f"{device} bfloat16": (device, "bfloat16")}
    for label, (dev, dtype) in runs.items():
        env = dict(os.environ, SURGERY_CACHE=str(scratch / f"cache-{dev}-{dtype}"))
        place = ["--device", dev, "--dtype", dtype]
        bias = FIXTURES / "bias_model"
        res = cli("find-neurons", bias, "--pairs", bias / "pairs.jsonl", "--n", neurons, "--json", *place, env=env)
        chosen = [(r["layer"], r["neuron"]) for r in json.loads(res.stdout)["summary"]["neurons"]]
        binding = FIXTURES / "binding_model"
        started = time.perf_counter()
        findings = scratch / f"heads-{dev}-{dtype}.json"
        cli(
            "find-heads",
            binding,
            "--benchmark",
            binding / "benchmark.jsonl",
            "--random-sets",
            "10",
            "--batch-size",
            "64",
            "--out",
            findings,
            *place,
            env=env,
        )
        heads = [tuple(h) for h in json.loads(findings.read_text())["selected_heads"]]
        out[label] = {"neurons": chosen, "heads": heads, "find_heads_s": time.perf_counter() - started}
    a, b = out.values()
    out["same_neurons"], out["same_heads"] = a["neurons"] == b["neurons"], a["heads"] == b["heads"]
    return out


def throughput(model_dir: Path, device: str, pairs: int, batch_size: int) -> dict:
    """Prompts/s of the neuron capture and of score-binding, and peak memory, in bfloat16."""
    import torch

    from surgery.find.heads.attention import surgery_attention_on
    from surgery.find.heads.benchmark import load_benchmark
    from surgery.find.heads.pairs import build_pairs
    from surgery.find.heads.scores import score_binding
    from surgery.find.neurons.pairs import load_pairs
    from surgery.find.neurons.scores import accumulate_pair_sums
    from surgery.model.loading import LoadSpec, load_model, load_tokenizer

    load = LoadSpec(device=device, dtype="bfloat16")
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    model, tok = load_model(model_dir, load), load_tokenizer(model_dir, load)
    loaded_s = time.perf_counter() - started
    neuron_pairs = load_pairs(str(FIXTURES / "bias_model" / "pairs.jsonl")).pairs
    neuron_pairs = (neuron_pairs * (pairs // len(neuron_pairs) + 1))[:pairs]
    accumulate_pair_sums(model, tok, neuron_pairs[:batch_size], batch_size)  # warm-up (kernels, caches)
    started = time.perf_counter()
    accumulate_pair_sums(model, tok, neuron_pairs, batch_size)
    capture_s = time.perf_counter() - started
    bench = load_benchmark(str(FIXTURES / "binding_model" / "benchmark.jsonl"))
    binding_pairs = build_pairs(bench, seed=0, max_pairs=pairs // 2)
    with surgery_attention_on(model):
        started = time.perf_counter()
        score_binding(model, tok, binding_pairs, batch_size=batch_size, features=True)
        binding_s = time.perf_counter() - started
    peak = (
        torch.cuda.max_memory_allocated(device) if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    return {
        "load_s": loaded_s,
        "capture_prompts_per_s": 2 * len(neuron_pairs) / capture_s,
        "binding_prompts_per_s": 4 * len(binding_pairs) / binding_s,
        "peak_memory_gb": peak / 1e9,
        "peak_memory_kind": "GPU allocated" if cuda else "process RSS",
    }


def main() -> None:
    from synthetic_checkpoint import build

    from surgery.model.placement import resolve_device

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--layers", type=int, default=32, help="depth of the 8B-shaped model (32 = the real one)")
    ap.add_argument("--pairs", type=int, default=256, help="pairs per throughput measurement")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--neurons", type=int, default=10, help="top neurons compared on the planted fixture")
    ap.add_argument("--scratch", type=Path, default=None, help="folder for the model and caches (default: temp)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    device = resolve_device(args.device)
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="surgery-gpu-check-"))
    scratch.mkdir(parents=True, exist_ok=True)
    import torch

    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else device
    print(f"device: {device} ({name}); torch {torch.__version__}", flush=True)
    result: dict = {"device": device, "device_name": name}
    result["planted"] = planted_agreement(device, args.neurons, scratch)
    p = result["planted"]
    print(
        f"planted fixtures, CPU float32 vs {device} bfloat16: same top-{args.neurons} neurons "
        f"{p['same_neurons']}, same selected heads {p['same_heads']}",
        flush=True,
    )
    started = time.perf_counter()
    model_dir = build(scratch / f"llama-3.1-8b-shapes-{args.layers}l", layers=args.layers)
    result["build_s"] = time.perf_counter() - started
    result["throughput"] = t = throughput(model_dir, device, args.pairs, args.batch_size)
    print(
        f"Llama-3.1-8B shapes, {args.layers} layers, bf16 on {device}: load {t['load_s']:.1f} s, "
        f"find-neurons capture {t['capture_prompts_per_s']:.1f} prompts/s, score-binding "
        f"{t['binding_prompts_per_s']:.1f} prompts/s, peak {t['peak_memory_kind']} {t['peak_memory_gb']:.2f} GB"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if not (p["same_neurons"] and p["same_heads"]):
        sys.exit("FAIL: bf16 findings on the device differ from CPU float32")
    print("OK")


if __name__ == "__main__":
    main()
