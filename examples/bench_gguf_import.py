#!/usr/bin/env python3
"""Benchmark: importing a GGUF (surgery import-gguf) whole, as transformers loads it, vs streamed.

    python examples/bench_gguf_import.py [GGUF ...] [--synthetic] [--runs 3] [--scratch DIR] [--json FILE]

GGUF defaults to the two files examples/get_models.py fetches: SmolLM2-135M-Instruct Q4_1 and
Gemma-3-270M Q4_K_M. Their peaks are set by transformers reading the metadata and building the
262k/49k-token tokenizers, not by the weights; ``--synthetic`` writes (once) a random F16 llama GGUF
whose weights dominate: 16 layers of hidden 2048 / MLP 8192, a 256-token vocabulary, 1.1 B weights
(2.1 GB file, 4.3 GB in float32). Each import runs in a fresh process, interleaved in a shuffled order:

* ``whole``: what import-gguf did before: ``from_pretrained(gguf_file=…)`` dequantizes every tensor
  into one dict, builds the float32 model, ``save_pretrained`` writes it (here by telling
  import_gguf the file cannot be streamed);
* ``streamed``: the default now: one block of tensors dequantized at a time into the shards
  (surgery/gguf/import_stream.py).

Printed per file: median wall time, peak RSS (VmHWM) and peak anonymous memory (examples/measure.py),
each peak also as a ratio to the GGUF's size and to the float32 weights written, and streamed/whole.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's surgery, not an installed one
from machine import stamp  # noqa: E402
from measure import run_measured  # noqa: E402

GB = 1e9
MODELS = Path(os.environ.get("SURGERY_MODELS", Path.home() / ".cache" / "surgery" / "models"))
DEFAULTS = [MODELS / ".gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf", MODELS / ".gguf" / "gemma-3-270m-q4_k_m.gguf"]
MODES = ("whole", "streamed")


def child(mode: str, gguf: str, out: str) -> None:
    """The measured process: import ``gguf`` into ``out`` the ``mode`` way."""
    import surgery.gguf.importing as gguf_import

    if mode == "whole":
        gguf_import.plan_streamed = lambda *args, **kwargs: None
    gguf_import.import_gguf(gguf, out, force=True)


def write_synthetic(path: Path, hidden: int = 2048, ffn: int = 8192, layers: int = 16, heads: int = 16) -> Path:
    """A seeded random F16 llama GGUF (4 KV heads, 256 tokens) at ``path``, written with gguf-py."""
    import gguf
    import numpy as np

    if path.is_file():
        return path
    rng, kv, tokens = np.random.default_rng(0), 4, ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(253)]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("synthetic llama")
    w.add_context_length(2048)
    w.add_block_count(layers)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(hidden // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([2, 3, 3] + [1] * (len(tokens) - 3))
    d = hidden // heads
    shapes = {"token_embd": (len(tokens), hidden), "output_norm": (hidden,), "output": (len(tokens), hidden)}
    for n in range(layers):
        shapes |= {f"blk.{n}.attn_norm": (hidden,), f"blk.{n}.ffn_norm": (hidden,)}
        shapes |= {f"blk.{n}.attn_q": (hidden, hidden), f"blk.{n}.attn_k": (kv * d, hidden)}
        shapes |= {f"blk.{n}.attn_v": (kv * d, hidden), f"blk.{n}.attn_output": (hidden, hidden)}
        shapes |= {f"blk.{n}.ffn_gate": (ffn, hidden), f"blk.{n}.ffn_up": (ffn, hidden)}
        shapes |= {f"blk.{n}.ffn_down": (hidden, ffn)}
    for base, shape in shapes.items():
        norm = len(shape) == 1
        value = np.ones(shape, np.float32) if norm else rng.normal(0, 0.02, shape).astype(np.float16)
        w.add_tensor(f"{base}.weight", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def measure(mode: str, gguf: Path, out: Path) -> dict:
    started = time.perf_counter()
    res, peak = run_measured([sys.executable, __file__, "--child", mode, str(gguf), str(out)])
    wall = time.perf_counter() - started
    if res.returncode != 0:
        sys.exit(f"{mode} import of {gguf.name} failed:\n{res.stderr[-3000:]}")
    return {"wall_s": wall, "rss_gb": peak.rss_bytes / GB, "anon_gb": peak.anon_bytes / GB}


def weights_gb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors")) / GB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", type=Path, nargs="*", default=DEFAULTS)
    ap.add_argument("--synthetic", action="store_true", help="benchmark a random F16 llama GGUF of 4.3 GB in float32")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/surgery-bench-gguf-import"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", nargs=3, metavar=("MODE", "GGUF", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    machine = stamp()
    if args.synthetic:
        args.scratch.mkdir(parents=True, exist_ok=True)
        args.gguf = [write_synthetic(args.scratch / "synthetic-llama-f16.gguf")]
    missing = [p for p in args.gguf if not p.is_file()]
    if missing:
        sys.exit(f"not found: {', '.join(map(str, missing))}; run `python examples/get_models.py` first")
    args.scratch.mkdir(parents=True, exist_ok=True)
    cases = [(g, m) for g in args.gguf for m in MODES] * args.runs
    random.Random(0).shuffle(cases)
    results: dict[tuple[str, str], list[dict]] = {}
    for gguf, mode in cases:
        out = args.scratch / f"{gguf.stem}-{mode}"
        results.setdefault((gguf.name, mode), []).append(measure(mode, gguf, out))
    summary: dict[str, dict] = {}
    print(f"{args.runs} runs each, medians (peaks also as a ratio to the GGUF file and to the float32 weights):")
    for gguf in args.gguf:
        size, written = gguf.stat().st_size / GB, weights_gb(args.scratch / f"{gguf.stem}-streamed")
        print(f"{gguf.name}: {size:.3f} GB file, {written:.3f} GB of float32 safetensors written")
        med = {}
        for mode in MODES:
            runs = results[(gguf.name, mode)]
            med[mode] = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "rss_gb", "anon_gb")}
            m = med[mode]
            print(
                f"  {mode:9s} {m['wall_s']:6.1f} s   peak RSS {m['rss_gb']:.2f} GB ({m['rss_gb'] / size:.2f}× file, "
                f"{m['rss_gb'] / written:.2f}× weights)   anon {m['anon_gb']:.2f} GB ({m['anon_gb'] / size:.2f}× file, "
                f"{m['anon_gb'] / written:.2f}× weights)"
            )
        ratio = {k: med["streamed"][k] / med["whole"][k] for k in ("wall_s", "rss_gb", "anon_gb")}
        print(
            f"  streamed/whole: time {ratio['wall_s']:.2f}, peak RSS {ratio['rss_gb']:.2f}, anon {ratio['anon_gb']:.2f}"
        )
        summary[gguf.name] = {"file_gb": size, "weights_gb": written, "medians": med, "streamed_over_whole": ratio}
    for gguf in args.gguf:
        for mode in MODES:
            shutil.rmtree(args.scratch / f"{gguf.stem}-{mode}", ignore_errors=True)
    if args.json:
        runs = {f"{g} {m}": r for (g, m), r in results.items()}
        args.json.write_text(json.dumps({"machine": machine, "runs": runs, "summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
