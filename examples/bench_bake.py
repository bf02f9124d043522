#!/usr/bin/env python3
"""Benchmark: baking 40 pruned neurons + 3 amplified heads into a >= 1 GB bf16 checkpoint.

    python examples/bench_bake.py [--gb 1.0] [--runs 3] [--double] [--no-transformers] [--json FILE]
    python examples/bench_bake.py --cli [--gb 1.0 --double]             # the commands as a user runs them
    python examples/bench_bake.py --cli --shape 8b --layers 32 --runs 1 \
        --verify-load="--device-map auto --max-memory cpu=8GiB"       # the 16 GB Llama-3.1-8B shape

Builds a random sharded Llama checkpoint (streamed to disk tensor by tensor, so building it needs
little memory), then times, interleaved and in fresh child processes, on a warm page cache:

* ``cp -r`` of the folder (the floor: every byte has to be written once);
* ``surgery.bake.bake.bake`` (library call, no numerical verify): copy, patch, undo data, sha256 of all;
* the obvious alternative: transformers ``from_pretrained`` → edit tensors in memory → ``save_pretrained``.

With ``--cli`` it times, instead, the commands as a user runs them, each interleaved with ``cp -r``:
``surgery prune-neurons SRC --neurons <40 neurons> --out DIR`` with ``--no-verify`` and with its
default check, and ``surgery verify SRC DIR`` on that output, and prints their ratios to ``cp``.
Those bakes take the source's sha256s from the hash cache an earlier bake left (a user's second
bake from a source); ``cli-first`` is ``--no-verify`` with an empty cache (a first bake).
``--shape 8b`` builds the exact Llama-3.1-8B shapes (hidden 4096, MLP 14336, 32/8 heads, vocab
128256); ``--layers`` fixes the layer count (32: the full 16 GB model).

Each child's peak RSS comes from ``os.wait4``. ``--double`` repeats cp and bake on a model twice
as large, to show that the bake's memory does not grow with the model. The bake child also reports
where its time goes (imports, planning, copy, patch, hashing) from the bake's progress callback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import stamp  # noqa: E402
from synthetic_checkpoint import write_shard  # noqa: E402  (tensor by tensor: memory is one pool, not the shard)

SHAPES = {
    "1b": dict(hidden=2048, ffn=5632, heads=16, kv_heads=4, head_dim=128, vocab=2048),
    "8b": dict(hidden=4096, ffn=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256),
}
HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, VOCAB = SHAPES["1b"].values()


def use_shape(name: str) -> None:
    """Set the model dimensions the builder and the edits use (module constants: children re-set them)."""
    global HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, VOCAB
    HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, VOCAB = SHAPES[name].values()


SHARD_BYTES = 400 << 20
N_NEURONS, N_HEADS, ALPHA = 40, 3, 2.5
CLI_METHODS = ("cli-no-verify", "cli-first", "cli", "cli-keep", "verify")
VERIFY_LOAD: list[str] = []  # load options for verify, e.g. --dtype bfloat16 (from --verify-load)
GNU_TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None


# --- building the checkpoint ------------------------------------------------------------------
def layer_shapes() -> dict[str, tuple[int, ...]]:
    kv = KV_HEADS * HEAD_DIM
    return {
        "input_layernorm.weight": (HIDDEN,),
        "post_attention_layernorm.weight": (HIDDEN,),
        "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
        "self_attn.k_proj.weight": (kv, HIDDEN),
        "self_attn.v_proj.weight": (kv, HIDDEN),
        "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
        "mlp.gate_proj.weight": (FFN, HIDDEN),
        "mlp.up_proj.weight": (FFN, HIDDEN),
        "mlp.down_proj.weight": (HIDDEN, FFN),
    }


def layers_for(gb: float) -> int:
    per_layer = sum(math.prod(s) for s in layer_shapes().values()) * 2
    return max(2, math.ceil((gb * 1e9 - 2 * VOCAB * HIDDEN * 2) / per_layer))


def all_tensors(layers: int) -> list[tuple[str, tuple[int, ...]]]:
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(layers):
        out += [(f"model.layers.{i}.{name}", shape) for name, shape in layer_shapes().items()]
    return out + [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]


def build(folder: Path, layers: int) -> Path:
    """A random bf16 Llama with ``layers`` layers in ~400 MB shards (reused when already there)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "dtype": "bfloat16",
    }
    if (folder / "config.json").is_file() and json.loads((folder / "config.json").read_text()) == config:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    shards, current, size = [], [], 0
    for name, shape in all_tensors(layers):
        nbytes = math.prod(shape) * 2
        if current and size + nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = [], 0
        current.append((name, shape))
        size += nbytes
    shards.append(current)
    rng = np.random.default_rng(0)
    weight_map, total = {}, 0
    for i, tensors in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_shard(folder / fname, [(n, s, "BF16") for n, s in tensors], rng)  # all bf16
        weight_map.update({name: fname for name, _ in tensors})
        total += sum(math.prod(s) * 2 for _, s in tensors)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def edits(layers: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """40 neurons and 3 heads spread over the layers (fixed seed): (layer, neuron), (layer, head)."""
    rng = np.random.default_rng(1)
    neurons = sorted({(int(rng.integers(layers)), int(rng.integers(FFN))) for _ in range(N_NEURONS * 2)})
    heads = [(layers // 4, 1), (layers // 2, 5), (3 * layers // 4, 9)]
    return neurons[:N_NEURONS], heads[:N_HEADS]


# --- the measured operations (each runs in its own child process) -------------------------------
def use_shape_of(src: Path) -> None:
    """Children take the shape of the checkpoint they are given."""
    hidden = json.loads((src / "config.json").read_text())["hidden_size"]
    use_shape(next(name for name, dims in SHAPES.items() if dims["hidden"] == hidden))


def child_bake(src: Path, dst: Path) -> dict:
    t0 = time.perf_counter()
    use_shape_of(src)
    import surgery
    from surgery import HeadScale, NeuronScale, Recipe
    from surgery.core.checkpoint import Checkpoint

    stages: dict[str, float] = {"imported": time.perf_counter()}
    cpu = _count_cpu(src)
    ckpt = Checkpoint(src)
    neurons, heads = edits(ckpt.config["num_hidden_layers"])
    recipe = Recipe(tuple(NeuronScale(l, n, 0.0) for l, n in neurons) + tuple(HeadScale(l, h, ALPHA) for l, h in heads))

    def progress(stage: str, done: int, total: int) -> None:
        stages.setdefault(stage, time.perf_counter())

    surgery.bake_recipe(src, recipe, dst, bake=surgery.BakeOptions(verify=False), stages=progress)
    stages["done"] = time.perf_counter()
    # Copy and patch interleave (a shard is patched right after it is copied), and hashing runs
    # on threads throughout; "hash wait" is what is left of it after the last file is written.
    phases = {
        "import": stages["imported"] - t0,
        "plan": stages["copy"] - stages["imported"],
        "copy+patch": stages["hash"] - stages["copy"],
        "hash wait": stages["done"] - stages["hash"],
    }
    return {"op_s": stages["done"] - t0, "phases": phases, "cpu": {k: round(v, 3) for k, v in cpu.items()}}


def _count_cpu(src: Path) -> dict[str, float]:
    """Wrap the bake's copy, patch and hash functions to add up the CPU time each one spends.

    Thread CPU time (user + kernel) is exact per call even while threads overlap, unlike wall time.
    """
    import surgery.bake.bake as bake_module

    totals = {"copy": 0.0, "patch": 0.0, "hash source": 0.0, "hash output": 0.0}

    def timed(fn, key_of):
        def wrapper(*args, **kwargs):
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[key_of(*args)] += time.thread_time() - start

        return wrapper

    bake_module.copy_file = timed(bake_module.copy_file, lambda *a: "copy")
    bake_module._patch_file = timed(bake_module._patch_file, lambda *a: "patch")
    bake_module.file_sha256 = timed(
        bake_module.file_sha256, lambda path, *a: "hash source" if Path(path).is_relative_to(src) else "hash output"
    )
    return totals


def child_transformers(src: Path, dst: Path) -> dict:
    t0 = time.perf_counter()
    use_shape_of(src)
    import torch
    from transformers import AutoModelForCausalLM

    t1 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    neurons, heads = edits(model.config.num_hidden_layers)
    with torch.no_grad():
        for layer, n in neurons:
            mlp = model.model.layers[layer].mlp
            mlp.gate_proj.weight[n] = 0
            mlp.up_proj.weight[n] = 0
            mlp.down_proj.weight[:, n] = 0
        for layer, h in heads:
            model.model.layers[layer].self_attn.o_proj.weight[:, h * HEAD_DIM : (h + 1) * HEAD_DIM] *= ALPHA
    model.save_pretrained(dst, max_shard_size=SHARD_BYTES)
    return {"op_s": time.perf_counter() - t0, "phases": {"import": t1 - t0, "load+edit+save": time.perf_counter() - t1}}


def neuron_spec(src: Path) -> str:
    """The 40 neurons of ``edits`` as prune-neurons' --neurons value."""
    neurons, _ = edits(json.loads((src / "config.json").read_text())["num_hidden_layers"])
    return ",".join(f"{layer}:{n}" for layer, n in neurons)


def cli_command(method: str, src: Path, dst: Path) -> list[str]:
    """The command a user types (through this Python, so that the same install runs)."""
    surgery = [sys.executable, "-m", "surgery"]
    if method == "verify":
        return [*surgery, "verify", str(src), str(dst), *VERIFY_LOAD]
    return [
        *surgery,
        "prune-neurons",
        str(src),
        "--neurons",
        neuron_spec(src),
        "--out",
        str(dst),
        *(["--no-verify"] if method in ("cli-no-verify", "cli-first") else []),
    ]


def run_child(method: str, src: Path, dst: Path) -> dict:
    """Run one measurement in a fresh process; wall time and peak RSS from the parent's view.

    Peak RSS comes from GNU time when installed: a child forked from this (larger) process and
    exec'd would otherwise report this process's RSS as its own high-water mark.
    """
    if method != "verify":  # verify reads the folder "cli-keep" baked, and writes nothing
        shutil.rmtree(dst, ignore_errors=True)
    if method == "cp":
        cmd = ["cp", "-r", str(src), str(dst)]
    elif method in CLI_METHODS:
        cmd = cli_command(method, src, dst)
    else:
        cmd = [sys.executable, __file__, "--child", method, str(src), str(dst)]
    rss_file = dst.parent / f".rss-{method}"
    if GNU_TIME:
        cmd = [GNU_TIME, "-f", "%M", "-o", str(rss_file), *cmd]
    env = {**os.environ, "TQDM_DISABLE": "1"}
    if method == "cli-first":  # a first bake from this source: no sha256 remembered from an earlier one
        env["SURGERY_CACHE"] = str(dst.parent / ".empty-cache")
        shutil.rmtree(env["SURGERY_CACHE"], ignore_errors=True)
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL if method in CLI_METHODS else None, env=env
    )
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{method} failed (exit {os.waitstatus_to_exitcode(status)})")
    rss_kb = int(rss_file.read_text().split()[-1]) if GNU_TIME else usage.ru_maxrss
    result = json.loads(out) if method not in ("cp", *CLI_METHODS) else {}
    if method not in ("verify", "cli-keep"):
        shutil.rmtree(dst, ignore_errors=True)
    cpu = usage.ru_utime + usage.ru_stime  # wait4 counts the child's own children too (GNU time → cp)
    return {"wall_s": wall, "cpu_s": cpu, "rss_mb": rss_kb / 1024, **result}


def measure(src: Path, methods: list[str], runs: int, scratch: Path) -> dict[str, list[dict]]:
    # A bake remembers a source file's sha256 only once the file has been still for 2 s (see
    # surgery.core.hash_cache); a model built just now must settle before the warm-up bakes.
    time.sleep(2.5)
    run_child("cp", src, scratch / "warm")  # page cache warm for everyone
    if "verify" in methods:  # verify checks one bake made by the default command
        run_child("cli-keep", src, scratch / "out-verify")
    results: dict[str, list[dict]] = {m: [] for m in methods}
    for i in range(runs):  # interleaved, so drift in machine load hits every method alike
        # Shuffled, too (seeded): whatever runs right after cp pays for writing back its dirty pages.
        for m in random.Random(i).sample(methods, len(methods)):
            results[m].append(run_child(m, src, scratch / f"out-{m}"))
            r = results[m][-1]
            print(
                f"  run {i + 1}/{runs} {m:<12} {r['wall_s']:7.2f} s wall {r['cpu_s']:7.2f} s CPU {r['rss_mb']:7.0f} MB",
                flush=True,
            )
    return results


def summary(results: dict[str, list[dict]]) -> dict[str, dict]:
    cp = statistics.median(r["wall_s"] for r in results["cp"])
    cp_cpu = statistics.median(r["cpu_s"] for r in results["cp"])
    out = {}
    for m, runs in results.items():
        wall = statistics.median(r["wall_s"] for r in runs)
        cpu = statistics.median(r["cpu_s"] for r in runs)
        row = {
            "median_s": round(wall, 3),
            "min_s": round(min(r["wall_s"] for r in runs), 3),
            "ratio_to_cp": round(wall / cp, 2),
            "median_cpu_s": round(cpu, 3),
            "cpu_ratio_to_cp": round(cpu / cp_cpu, 2),
            "peak_rss_mb": round(max(r["rss_mb"] for r in runs)),
        }
        if runs[0].get("cpu"):
            row["cpu_median_s"] = {k: round(statistics.median(r["cpu"][k] for r in runs), 3) for k in runs[0]["cpu"]}
        if runs[0].get("phases"):
            row["phases_median_s"] = {
                k: round(statistics.median(r["phases"].get(k, 0.0) for r in runs), 3) for k in runs[0]["phases"]
            }
        out[m] = row
    return out


def print_table(title: str, table: dict[str, dict]) -> None:
    print(f"\n{title}")
    print(f"  {'method':<14}{'wall s':>8}{'× cp':>7}{'CPU s':>8}{'× cp':>7}{'peak RSS':>12}")
    for m, row in table.items():
        print(
            f"  {m:<14}{row['median_s']:>8.2f}{row['ratio_to_cp']:>7.2f}{row['median_cpu_s']:>8.2f}"
            f"{row['cpu_ratio_to_cp']:>7.2f}{row['peak_rss_mb']:>9} MB"
        )
        if "phases_median_s" in row:
            print("      wall by stage: " + ", ".join(f"{k} {v:.2f}" for k, v in row["phases_median_s"].items()))
        if "cpu_median_s" in row:
            print("      CPU by task:   " + ", ".join(f"{k} {v:.2f}" for k, v in row["cpu_median_s"].items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=1.0, help="Model size in GB (>= 1 for the issue's target).")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--double", action="store_true", help="Also run cp and bake on a 2x larger model.")
    parser.add_argument("--no-transformers", action="store_true", help="Skip the load/edit/save baseline.")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/surgery-bench"))
    parser.add_argument("--json", type=Path, help="Also write the results here.")
    parser.add_argument(
        "--cli",
        action="store_true",
        help="Time the commands as a user runs them (prune-neurons "
        "with --no-verify and with its check, verify) against cp.",
    )
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="1b",
        help="Layer shapes: 1b (hidden 2048) or 8b (Llama-3.1-8B: hidden 4096, MLP 14336, vocab 128256).",
    )
    parser.add_argument("--layers", type=int, help="Number of layers (instead of --gb); 32 with --shape 8b is 16 GB.")
    parser.add_argument(
        "--verify-load",
        default="",
        help="Load options for verify, e.g. '--dtype bfloat16' or "
        "'--device-map auto --max-memory cpu=8GiB' (the 16 GB model does not fit 24 GB in float32).",
    )
    parser.add_argument("--child", nargs=3, metavar=("METHOD", "SRC", "DST"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        method, src, dst = args.child
        fn = {"bake": child_bake, "transformers": child_transformers}[method]
        print(json.dumps(fn(Path(src), Path(dst))))
        return

    use_shape(args.shape)
    VERIFY_LOAD[:] = args.verify_load.split()
    args.workdir.mkdir(parents=True, exist_ok=True)
    report = {
        "machine": stamp(),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "runs": args.runs,
        "shape": args.shape,
        "edits": f"{N_NEURONS} pruned neurons" + ("" if args.cli else f" + {N_HEADS} heads × {ALPHA}"),
        "models": {},
    }
    sizes = [("1x", args.gb)] + ([("2x", 2 * args.gb)] if args.double else [])
    for label, gb in sizes:
        layers = args.layers * (2 if label == "2x" else 1) if args.layers else layers_for(gb)
        src = build(args.workdir / f"llama-{args.shape}-{layers}l", layers)
        size = sum(p.stat().st_size for p in src.iterdir())
        shards = len(list(src.glob("*.safetensors")))
        print(f"\n{label}: {src} — {size / 1e9:.2f} GB bf16, {layers} layers, {shards} shards", flush=True)
        if args.cli:
            methods = ["cp", "cli-first", "cli-no-verify", "cli", "verify"]
        else:
            methods = ["cp", "bake"] + ([] if args.no_transformers or label != "1x" else ["transformers"])
        table = summary(measure(src, methods, args.runs, args.workdir))
        report["models"][label] = {"bytes": size, "layers": layers, "shards": shards, "results": table}
        print_table(f"{label} ({size / 1e9:.2f} GB), median of {args.runs}:", table)
        if args.cli:
            ratios = {m: table[m]["ratio_to_cp"] for m in ("cli-first", "cli-no-verify", "cli")}
            print(
                f"  prune-neurons --no-verify {ratios['cli-no-verify']:.2f}× cp (target ≤ 1.3; "
                f"{ratios['cli-first']:.2f}× as the first bake from this source), default "
                f"{ratios['cli']:.2f}× cp (target ≤ 1.6); peak RSS {table['cli-no-verify']['peak_rss_mb']} / "
                f"{table['cli']['peak_rss_mb']} MB (target ≤ 400); verify {table['verify']['median_s']:.2f} s, "
                f"{table['verify']['peak_rss_mb']} MB"
            )
    if args.double:
        key = "cli" if args.cli else "bake"
        rss = [report["models"][k]["results"][key]["peak_rss_mb"] for k in ("1x", "2x")]
        print(f"\n{key} peak RSS: {rss[0]} MB at 1x, {rss[1]} MB at 2x")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
