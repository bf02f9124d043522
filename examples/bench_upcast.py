#!/usr/bin/env python3
"""Peak memory of float32 compute on a bf16, FP8 or int4 checkpoint: the whole model converted vs a layer at a time.

    python examples/bench_upcast.py [--model DIR] [--fp8 | --int4] [--runs 3] [--scratch DIR] [--json FILE]

MODEL is a bf16 checkpoint; without it a random Llama with SmolLM2-360M's shapes (362M
parameters, 0.72 GB in bf16, tied embeddings) is built from its config. ``--fp8``: the random
model's decoder linears are quantized to e4m3 with 128×128 block scales, as DeepSeek / Qwen FP8
releases store them (the rest stays bf16, 0.45 GB in all); ``whole`` then dequantizes the model to
float32 as it loads (what load_model did before), ``layerwise`` holds the e4m3 values in bf16 and
dequantizes a layer per call (surgery/model/dequantized.py). ``--int4``: the decoder linears are
compressed by compressed-tensors as llm-compressor writes W4A16 (pack-quantized, symmetric, groups
of 64: 128 does not divide 960); ``whole`` is then transformers' decompression to float32, and
``layerwise`` holds each weight's codes in bf16, times its scales a layer per call
(surgery/formats/int_packed/hold.py). A baked copy with a few
pruned neurons is written once (``surgery prune-neurons --no-verify``). Then, interleaved in a
shuffled order, each in a fresh process on the CPU (``--dtype auto``: float32):

* ``forward``: load_model and one forward pass over 4 × 64 tokens;
* ``verify``: ``surgery.bake.verify.verify(SRC, DST)`` (the source with the run-time twins, then
  with the baked tensors swapped in, as ``surgery verify`` runs it);

each under ``whole`` (load_model as it was: the checkpoint converted to float32 when loaded;
here by telling the loader the checkpoint is not 16-bit) and ``layerwise`` (the default now:
weights kept in bf16, a layer upcast per call, surgery/model/upcast.py). Printed: the median
peak RSS (VmHWM) and peak anonymous memory over the runs, each as a ratio to the checkpoint's
size, and the median wall time.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's surgery, not an installed one
from machine import stamp  # noqa: E402
from measure import run_measured  # noqa: E402

GB = 1e9
SMOLLM2_360M = dict(
    hidden_size=960,
    intermediate_size=2560,
    num_hidden_layers=32,
    num_attention_heads=15,
    num_key_value_heads=5,
    vocab_size=49152,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
NEURONS = "0:5,7:100,15:2000,31:2559"


def build_random(path: Path) -> Path:
    """A seeded random bf16 Llama with SmolLM2-360M's shapes (no tokenizer: verify then uses fixed ids)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (path / "config.json").exists():
        return path
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_360M)).to(torch.bfloat16)
    model.save_pretrained(path)
    return path


def quantize_fp8(src: Path, out: Path, block: int = 128) -> Path:
    """``src`` with its decoder linears in e4m3, one float32 scale per ``block``×``block`` block
    (``weight_scale_inv``, quant_method fp8), the other tensors as they are."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    if (out / "config.json").exists():
        return out
    out.mkdir(parents=True)
    tensors = load_file(src / "model.safetensors")
    for name in [n for n in tensors if ".layers." in n and n.endswith("proj.weight")]:
        w = tensors[name].float()
        rows, cols = -(-w.shape[0] // block), -(-w.shape[1] // block)
        padded = torch.zeros(rows * block, cols * block)
        padded[: w.shape[0], : w.shape[1]] = w.abs()
        scale = padded.reshape(rows, block, cols, block).amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
        each = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[: w.shape[0], : w.shape[1]]
        tensors[name] = (w / each).clamp(-448, 448).to(torch.float8_e4m3fn)
        tensors[name.removesuffix("weight") + "weight_scale_inv"] = scale
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [block, block],
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for other in src.glob("*.json"):
        if other.name != "config.json":
            shutil.copy(other, out)
    return out


def quantize_int4(src: Path, out: Path) -> Path:
    """A copy of ``src`` with its decoder linears compressed by compressed-tensors as W4A16
    (pack-quantized, symmetric, groups of 64, min/max rule), the other tensors as they are."""
    import shutil

    import torch

    from tests.support.int_packed import compress_folder

    if not out.exists():  # written beside, then renamed: an interrupted run leaves no half-compressed copy
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(src, partial)
        compress_folder(partial, "w4a16-g64", torch.bfloat16)
        partial.rename(out)
    return out


def child(mode: str, task: str, src: str, dst: str) -> None:
    """The measured process: ``task`` on ``src`` (and ``dst``) with the loader in ``mode``."""
    import torch

    import surgery.formats.fp8.hold as dequantized
    import surgery.formats.int_packed.hold as int_dequantized
    import surgery.model.upcast as upcast
    from surgery.core.checkpoint import Checkpoint
    from surgery.model.loading import LoadSpec, load_model

    if mode == "whole":  # what load_model did before: no 16-bit load, the whole model converted
        upcast.stored_dtype = lambda tensors: None
        dequantized.layerwise_dtype = lambda ckpt, model_class: None
        int_dequantized.layerwise_dtype = lambda ckpt, model_class: None
    load = LoadSpec(device="cpu")
    if task == "forward":
        model = load_model(src, load)
        ids = torch.randint(3, model.config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        assert logits.dtype == torch.float32
    else:
        from surgery.bake.verify import verify

        report = verify(Checkpoint(src), dst, load=load)
        assert report.ok, report.problems


def measure(mode: str, task: str, src: Path, dst: Path) -> dict:
    started = time.perf_counter()
    res, peak = run_measured([sys.executable, __file__, "--child", mode, task, str(src), str(dst)])
    wall = time.perf_counter() - started
    if res.returncode != 0:
        sys.exit(f"{mode} {task} failed:\n{res.stderr[-3000:]}")
    return {"wall_s": wall, "rss_gb": peak.rss_bytes / GB, "anon_gb": peak.anon_bytes / GB}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="a bf16 checkpoint (default: a random one)")
    kind = ap.add_mutually_exclusive_group()
    kind.add_argument("--fp8", action="store_true", help="quantize the random model to FP8 (128×128 blocks)")
    kind.add_argument("--int4", action="store_true", help="compress the random model to W4A16 (groups of 64)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/surgery-bench-upcast"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", nargs=4, metavar=("MODE", "TASK", "SRC", "DST"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    machine = stamp()
    args.scratch.mkdir(parents=True, exist_ok=True)
    src = args.model or build_random(args.scratch / "smollm2-360m-shapes-bf16")
    if args.fp8 and not args.model:
        src = quantize_fp8(src, args.scratch / "smollm2-360m-shapes-fp8")
    if args.int4 and not args.model:
        src = quantize_int4(src, args.scratch / "smollm2-360m-shapes-w4a16")
    dst = args.scratch / ("pruned-fp8" if args.fp8 else "pruned-w4a16" if args.int4 else "pruned")
    if not (dst / "config.json").exists():
        bake = [sys.executable, "-m", "surgery", "prune-neurons", str(src), "--neurons", NEURONS, "--no-verify"]
        subprocess.run([*bake, "--out", str(dst)], check=True, capture_output=True)
    size = sum(f.stat().st_size for f in src.glob("*.safetensors")) / GB
    cases = [(m, t) for m in ("whole", "layerwise") for t in ("forward", "verify")] * args.runs
    random.Random(0).shuffle(cases)
    results: dict[str, list[dict]] = {}
    for mode, task in cases:
        results.setdefault(f"{task} {mode}", []).append(measure(mode, task, src, dst))
    print(f"checkpoint: {src} ({size:.3f} GB of safetensors), {args.runs} runs each, medians:")
    summary = {}
    for name in sorted(results):
        med = {k: statistics.median(r[k] for r in results[name]) for k in ("wall_s", "rss_gb", "anon_gb")}
        summary[name] = {**med, "rss_ratio": med["rss_gb"] / size, "anon_ratio": med["anon_gb"] / size}
        print(
            f"  {name:20s} peak RSS {med['rss_gb']:.2f} GB ({med['rss_gb'] / size:.2f}× the checkpoint), "
            f"anon {med['anon_gb']:.2f} GB ({med['anon_gb'] / size:.2f}×), {med['wall_s']:.1f} s"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"machine": machine, "checkpoint_gb": size, "runs": results, "medians": summary}, indent=1)
        )


if __name__ == "__main__":
    main()
