#!/usr/bin/env python3
"""Benchmark: baking 40 pruned neurons + 3 heads (α = 2) into a GGUF, against ``cp`` of the same file.

    python examples/bench_gguf.py [GGUF | --synthetic] [--runs 5] [--old-tree DIR] [--json FILE]

GGUF defaults to SmolLM2-135M-Instruct Q4_1 where examples/get_models.py puts it. ``--synthetic``: a
1.1 GB GGUF with Llama-3.1-8B's shapes cut to 4 layers (random Q4_K blocks with sane f16 scales,
attn_output Q8_0 so a head's columns are whole blocks, a 128,256-entry vocabulary), written once
beside the real models with gguf-py's writer. Times, interleaved, each in a fresh child process on a
warm page cache, with the child's peak RSS from ``os.wait4``:

* ``cp SRC DST`` (the floor: every byte is written once);
* ``lib``: ``surgery.bake.gguf.bake_gguf`` called in a child (imports not counted): header, plan,
  edited blocks, one streaming copy with both sha256s, sidecars;
* ``cli``: ``surgery apply RECIPE --model SRC --out DST`` as a user runs it (interpreter start and imports
  included);
* ``sha256``: hashlib over the file, read into one 1 MB buffer (the bake hashes its output: a floor with ``cp``);
* with ``--old-tree DIR``, ``lib old``: the same library call by that checkout's ``surgery`` right after
  ``lib``, its output's recorded sha256 compared with ``lib``'s (the same bytes, or the run fails).

``lib`` also reports where its time goes: imports, open (header and the cached config), prepare
(plan, the edited blocks read, changed and checked), the streaming copy with the output's sha256
(``stream_patched``), and the rest (undo and record sidecars, the hash cache).

The transformers config of the GGUF and the source's sha256 are cached by the first bake (a user's
second bake from a file); ``first`` is one CLI run with empty caches, and ``first lib`` one library
call with empty caches, its open split into check_supported (transformers imported, the architecture
checked) and the rest of the config (transformers' ``AutoConfig`` reading the GGUF). Medians are printed, with the
ratio to cp's median.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import stamp

MODELS = Path(os.environ.get("SURGERY_MODELS", Path.home() / ".cache" / "surgery" / "models"))
DEFAULT = MODELS / ".gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
REPO = Path(__file__).resolve().parent.parent

CONFIG_CHILD = """
import json, sys
from surgery.gguf.model import open_gguf
print(json.dumps(open_gguf(sys.argv[1]).config))
"""
LIB_CHILD = """
import json, sys, time
t0 = time.perf_counter()
from pathlib import Path
from surgery.core.edits import Recipe
import surgery.bake.gguf as bake
from surgery.gguf.model import open_gguf
spent = {"imports": time.perf_counter() - t0}
def timed(name, f):
    def run(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
    return run
bake.prepare = timed("prepare", bake.prepare)
bake.stream_patched = timed("copy+sha256", bake.stream_patched)
import surgery.gguf.model as gguf_model
gguf_model.check_supported = timed("check_supported", gguf_model.check_supported)
gguf_model._config = timed("config", gguf_model._config)
t = time.perf_counter()
model = open_gguf(sys.argv[1])
spent["open"] = time.perf_counter() - t
bake.bake_gguf(model, Recipe.load(sys.argv[2]), Path(sys.argv[3]))
spent["total"] = time.perf_counter() - t
spent["rest"] = spent["total"] - spent["open"] - spent["prepare"] - spent["copy+sha256"]
print(json.dumps(spent))
"""
HASH_CHILD = """
import hashlib, sys
h, view = hashlib.sha256(), memoryview(bytearray(1 << 20))
with open(sys.argv[1], "rb", buffering=0) as f:
    while n := f.readinto(view):
        h.update(view[:n])
"""
# A llama.cpp-style file of Llama-3.1-8B's shapes (hidden 4096, MLP 14336, 32 heads of 128, 8 KV heads).
SYNTHETIC = MODELS / ".gguf" / "synthetic-llama-3.1-8b-4layers-Q4_K.gguf"
SYNTHETIC_CHILD = """
import sys
from pathlib import Path
import numpy as np
import gguf
sys.path.insert(0, ".")
from tests.support.typed_gguf import random_blocks
H, F, HEADS, KV, D, VOCAB, LAYERS = 4096, 14336, 32, 8, 128, 128256, 4
path = Path(sys.argv[1])
partial = path.with_name(path.name + ".partial")
rng = np.random.default_rng(0)
w = gguf.GGUFWriter(str(partial), "llama")
w.add_name("synthetic llama-3.1-8b shapes, 4 layers")
for add, value in [(w.add_context_length, 8192), (w.add_block_count, LAYERS), (w.add_embedding_length, H),
                   (w.add_feed_forward_length, F), (w.add_head_count, HEADS), (w.add_head_count_kv, KV),
                   (w.add_rope_dimension_count, D), (w.add_layer_norm_rms_eps, 1e-5), (w.add_vocab_size, VOCAB)]:
    add(value)
w.add_tokenizer_model("llama")
w.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(VOCAB - 3)])
w.add_token_scores([0.0] * VOCAB)
w.add_token_types([2, 3, 3] + [1] * (VOCAB - 3))
shapes = {"token_embd": (VOCAB, H)}
for i in range(LAYERS):
    shapes.update({f"blk.{i}.attn_norm": (H,), f"blk.{i}.attn_q": (H, H), f"blk.{i}.attn_k": (KV * D, H),
                   f"blk.{i}.attn_v": (KV * D, H), f"blk.{i}.attn_output": (H, H), f"blk.{i}.ffn_norm": (H,),
                   f"blk.{i}.ffn_gate": (F, H), f"blk.{i}.ffn_up": (F, H), f"blk.{i}.ffn_down": (H, F)})
shapes.update({"output_norm": (H,), "output": (VOCAB, H)})
for base, shape in shapes.items():
    if len(shape) == 1:
        w.add_tensor(f"{base}.weight", np.ones(shape, np.float32))
        continue
    kind = "Q8_0" if base.endswith("attn_output") else "Q4_K"
    data = random_blocks(kind, *shape, rng)
    w.add_tensor(f"{base}.weight", data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType[kind])
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
partial.rename(path)
"""


def recipe_text(layers: int, ffn: int, heads: int, seed: int = 0) -> str:
    """40 random neurons (pruned) and 3 random heads (α = 2) as a recipe YAML."""
    rng = random.Random(seed)
    neurons = rng.sample([(la, n) for la in range(layers) for n in range(ffn)], 40)
    chosen = rng.sample([(la, h) for la in range(layers) for h in range(heads)], 3)
    lines = ["version: 1", "edits:"]
    lines += [f"- {{type: neuron, layer: {la}, neuron: {n}, factor: 0.0}}" for la, n in neurons]
    lines += [f"- {{type: head, layer: {la}, head: {h}, alpha: 2.0}}" for la, h in chosen]
    return "\n".join(lines) + "\n"


def timed(cmd: list[str], env: dict[str, str], cwd: Path = REPO) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MB, stdout) of ``cmd`` in a child (``python -c`` imports from ``cwd`` first)."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    out = proc.stdout.read().decode()
    err = proc.stderr.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err}")
    return wall, usage.ru_maxrss / 1024, out


def output_sha256(out: Path) -> str:
    """The sha256 that a bake's record gives its output GGUF."""
    record = json.loads(out.with_name(out.name + ".surgery.json").read_text())
    return record["files"][out.name]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--synthetic", action="store_true", help=f"bake {SYNTHETIC.name} (written on first use)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--old-tree", type=Path, default=None, help="another checkout: its library call after each lib")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.synthetic:
        args.gguf = SYNTHETIC
        if not SYNTHETIC.is_file():
            SYNTHETIC.parent.mkdir(parents=True, exist_ok=True)
            timed([sys.executable, "-c", SYNTHETIC_CHILD, str(SYNTHETIC)], dict(os.environ, PYTHONPATH=str(REPO)))
    if not args.gguf.is_file():
        raise SystemExit(f"{args.gguf} not found; run `python examples/get_models.py` first")
    machine = stamp()
    with tempfile.TemporaryDirectory(prefix="bench-gguf-") as tmp:
        tmp = Path(tmp)
        # This process imports nothing heavy: a child's peak RSS counts its parent's pages before exec.
        env = dict(os.environ, SURGERY_CACHE=str(tmp / "cache"), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        config = json.loads(timed([sys.executable, "-c", CONFIG_CHILD, str(args.gguf)], env)[2])
        recipe = tmp / "recipe.yaml"
        recipe.write_text(
            recipe_text(config["num_hidden_layers"], config["intermediate_size"], config["num_attention_heads"])
        )
        out = tmp / "out.gguf"

        def clear() -> None:
            for p in tmp.glob("out.gguf*"):
                p.unlink()

        cli = [sys.executable, "-m", "surgery", "apply", str(recipe), "--model", str(args.gguf), "--out", str(out)]
        first = timed(cli, dict(env, SURGERY_CACHE=str(tmp / "cold")))  # config read from the GGUF, source hashed
        clear()
        lib = [sys.executable, "-c", LIB_CHILD, str(args.gguf), str(recipe), str(out)]
        first_lib = json.loads(timed(lib, dict(env, SURGERY_CACHE=str(tmp / "cold-lib")))[2].strip().splitlines()[-1])
        clear()
        timed(cli, env)  # warm-up: the source's sha256 goes to the hash cache
        clear()
        results: dict[str, list[tuple[float, float]]] = {"cp": [], "lib": [], "cli": [], "sha256": []}
        if args.old_tree:
            results["lib old"] = []
        stages: list[dict[str, float]] = []
        for _ in range(args.runs):
            results["cp"].append(timed(["cp", str(args.gguf), str(out)], env)[:2])
            clear()
            wall, rss, printed = timed(lib, env)
            stages.append(json.loads(printed.strip().splitlines()[-1]))
            results["lib"].append((stages[-1]["total"], rss))
            if args.old_tree:
                ours = output_sha256(out)
                clear()
                old = args.old_tree.resolve()
                wall, rss, printed = timed(lib, dict(env, PYTHONPATH=str(old)), cwd=old)
                results["lib old"].append((json.loads(printed.strip().splitlines()[-1])["total"], rss))
                if output_sha256(out) != ours:
                    raise SystemExit(f"{old}'s bake wrote other bytes than this tree's")
            clear()
            results["cli"].append(timed(cli, env)[:2])
            clear()
            results["sha256"].append(timed([sys.executable, "-c", HASH_CHILD, str(args.gguf)], env)[:2])
        python = statistics.median(timed([sys.executable, "-c", "pass"], env)[0] for _ in range(args.runs))
    size = args.gguf.stat().st_size / 2**20
    cp = statistics.median(w for w, _ in results["cp"])
    print(f"{args.gguf.name}: {size:.0f} MiB, 40 neurons pruned + 3 heads × 2, median of {args.runs} runs")
    print(f"{'':6} {'seconds':>8} {'× cp':>6} {'peak RSS MB':>12}")
    summary = {
        "machine": machine,
        "file": args.gguf.name,
        "mib": round(size, 1),
        "runs": args.runs,
        "first_cli_s": round(first[0], 3),
        "first_cli_rss_mb": round(first[1], 1),
    }
    for name, rows in results.items():
        wall = statistics.median(w for w, _ in rows)
        rss = statistics.median(r for _, r in rows)
        print(f"{name:6} {wall:8.3f} {wall / cp:6.1f} {rss:12.0f}")
        summary[name] = {"median_s": round(wall, 3), "ratio_to_cp": round(wall / cp, 2), "peak_rss_mb": round(rss, 1)}
    print(f"first  {first[0]:8.3f} {first[0] / cp:6.1f} {first[1]:12.0f}   (cli, empty caches)")
    parts = {k: round(statistics.median(s.get(k, 0.0) for s in stages), 3) for k in stages[0]}
    print(f"lib's time (median s): {', '.join(f'{k} {v:.3f}' for k, v in parts.items())}; python start {python:.3f}")
    summary["lib_parts_s"] = parts
    first_lib = {k: round(v, 3) for k, v in first_lib.items()}
    print(f"first lib's time (s, empty caches): {', '.join(f'{k} {v:.3f}' for k, v in first_lib.items())}")
    summary["first_lib_parts_s"] = first_lib
    summary["python_start_s"] = round(python, 3)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
