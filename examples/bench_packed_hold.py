#!/usr/bin/env python3
"""Benchmark: an NVFP4, int4 or MXFP4 checkpoint loaded for float32 compute on a CPU, held as stored against
held in 16 bits.

    python examples/bench_packed_hold.py --old-tree /work/main [--model ~/.cache/surgery/models/smollm2-135m-instruct]
        [--format nvfp4|w4a16|mxfp4] [--runs 3] [--json FILE]
    python examples/bench_packed_hold.py --source FOLDER | --model FOLDER --format nvfp4
        [--steps load find-neurons eval bake verify find-heads] [--pairs 8] [--runs 1] [--old-tree DIR]

Makes SmolLM2 NVFP4 as examples/bench_fp4.py does (compressed-tensors' compressor; ``--format w4a16``:
W4A16, symmetric, groups of 64, by tests/support/int_packed.py's compressor, the other tensors in bfloat16
as llm-compressor saves a model it loaded in bf16), or, ``--format mxfp4``, a random gpt-oss whose experts
dominate (:data:`MXFP4_SIZES`), its experts MXFP4 as the gpt-oss release stores them (tests/support/mxfp4.py:
compressed-tensors' MXFP4 quantizer), the rest bfloat16; then, in fresh child
processes, interleaved in each run: the imports a load needs (their RSS is the floor of every load), and
``load_model`` (CPU, float32) plus one forward pass of 64 tokens, once with the surgery of ``--old-tree``
(another checkout: its loader) and once with this one. Each child reports the bytes its model holds
(distinct parameter and buffer storages), its load and forward times and its peak RSS after the load
(VmHWM, before the forward pass widens a layer or the embeddings); its peak RSS over both is the kernel's
VmHWM, its anonymous memory sampled (examples/measure.py). Printed against the file's size and the target
(issue 36): 1.5× the file plus the largest decoder layer in float32, above the imports, each peak saying
whether it meets it; with the ratios new / old of the same run; the logits of the two loads are compared
bit for bit.

At real shapes (issue 36: on toys the fixed costs dominate): ``--source`` measures a quantized checkpoint
as it is (examples/synthetic_checkpoint.py's ``--shape gpt-oss-20b``, MXFP4 experts), ``--model`` with
``--format nvfp4`` an NVFP4 copy of a folder (e.g. its Llama-3.1-8B shapes, compressed shard by shard by
examples/bench_fp4.py's ``quantize``). ``--steps`` adds, each in a child process of this tree's CLI
(``python -m surgery``, every other step after ``load`` measured the same way): ``find-neurons`` on
``--pairs`` builtin English pairs (a category at a time, those whose prompts are as long in the model's
tokens: the others are skipped), ``eval`` (retention, ``--limit 2 --batch-size 2``), ``bake`` (``prune-neurons`` of two
neurons, ``--no-verify``) and ``verify`` of that bake, ``find-heads`` (``--max-pairs 2``, no confirmation,
one random set). Each step's peak is printed against the same target; ``--old-tree`` is then optional
(given, every step runs on both trees).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MB = 1024**2
STEPS = ("load", "find-neurons", "eval", "bake", "verify", "find-heads")
# A gpt-oss small enough for a 2-core VM whose experts are most of the file, as in the releases (gpt-oss-20b:
# 32 experts of 2880 × 2880 a layer): 4 layers of 32 experts, each [512 → 2 × 512 → 512].
MXFP4_SIZES = dict(
    hidden_size=512,
    intermediate_size=512,
    num_local_experts=32,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=4096,
    max_position_embeddings=128,
)


def child(task: str, tree: str, src: str, out: str) -> None:
    """The measured process: ``task`` ("imports" or "load") on ``src`` with the surgery of ``tree``."""
    sys.path.insert(0, tree)
    import compressed_tensors.compressors.nvfp4.helpers  # noqa: F401
    import compressed_tensors.compressors.pack_quantized.helpers  # noqa: F401
    import torch
    from transformers import AutoModelForCausalLM  # noqa: F401

    import surgery
    from surgery.model.loading import LoadSpec, load_model

    assert Path(surgery.__file__).resolve().is_relative_to(Path(tree).resolve()), surgery.__file__
    if task == "imports":
        return
    started = time.perf_counter()
    model = load_model(src, LoadSpec(device="cpu", dtype="float32"))
    loaded = time.perf_counter()
    load_hwm = _status("VmHWM")  # the peak so far: the load's, before the forward pass widens anything
    ids = torch.randint(3, model.config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    done = time.perf_counter()
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in [*model.parameters(), *model.buffers()]
    }
    torch.save(logits, out)
    record = {"load_s": loaded - started, "forward_s": done - loaded, "held_bytes": sum(storages.values())}
    print(json.dumps({**record, "load_rss_mb": load_hwm / MB}))


def _status(key: str) -> int:
    """A field of this process's /proc status, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def measure(cmd: list[str], kill_above: int | None = None, **popen) -> dict:
    """``cmd``'s time and peaks (and the JSON line it printed last); stopped past ``kill_above`` bytes of RSS,
    which its row then says (``killed``)."""
    sys.path.insert(0, str(HERE))
    from measure import run_measured

    started = time.perf_counter()
    res, peak = run_measured(cmd, kill_above=kill_above, **popen)
    wall = time.perf_counter() - started
    row = {"wall_s": wall, "rss_mb": peak.rss_bytes / MB, "anon_mb": peak.anon_bytes / MB}
    if peak.killed:
        print(f"{cmd[3:5]} stopped at {row['rss_mb']:.0f} MB RSS (--max-rss-gb)", flush=True)
        return {**row, "killed": True}
    if res.returncode != 0:
        sys.exit(f"{cmd[3:]} failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
    if lines:
        row.update(json.loads(lines[-1]))
    return row


def small_pairs(src: Path, out: Path, n: int) -> Path:
    """The first ``n`` builtin English pairs, a category at a time, whose two prompts are as many of
    ``src``'s tokens long (find-neurons skips the others: a character-level tokenizer keeps few)."""
    from transformers import AutoTokenizer

    from surgery.find.neurons.pairs import load_pairs

    tok = AutoTokenizer.from_pretrained(src)
    by_category: dict[str, list] = {}
    for pair in load_pairs(language="en").pairs:
        if len(tok(pair.prompt_1)["input_ids"]) == len(tok(pair.prompt_2)["input_ids"]):
            by_category.setdefault(pair.category, []).append(pair)
    chosen, queues = [], list(by_category.values())
    while len(chosen) < n and any(queues):
        for queue in queues:
            if queue and len(chosen) < n:
                chosen.append(queue.pop(0))
    out.write_text("".join(json.dumps(p.to_dict(), ensure_ascii=False) + "\n" for p in chosen))
    return out


def step_command(step: str, src: Path, scratch: Path, tag: str, pairs: Path, layers: int, experts: bool) -> list[str]:
    """The CLI arguments of ``step`` (not ``load``) on ``src`` (of ``layers`` layers, of ``experts``); ``tag``
    names its outputs in ``scratch``."""
    cpu = ["--device", "cpu", "--dtype", "float32"]
    baked = scratch / f"baked-{tag}"
    if step == "find-neurons":
        out = ["--pairs", str(pairs), "--recompute", "--out", str(scratch / f"neurons-{tag}.json")]
        return [step, str(src), *cpu, *out]
    if step == "eval":
        # --batch-size 2: perplexity one window a pass, whose logits ([1, ≤ 1024, vocab] in float32) add to the peak
        small = ["--suite", "retention", "--limit", "2", "--batch-size", "2"]
        return [step, str(src), *cpu, *small, "--out", str(scratch / f"eval-{tag}.json")]
    if step == "bake":
        neurons = f"0:e0:5,{layers - 1}:e1:17" if experts else f"0:5,{layers - 1}:17"  # routed experts 0, 1
        return ["prune-neurons", str(src), "--neurons", neurons, "--out", str(baked), "--force", "--no-verify"]
    if step == "verify":
        return [step, str(src), str(baked), *cpu]
    if step == "find-heads":
        small = ["--max-pairs", "2", "--confirm", "0", "--random-sets", "1", "--knockout-heads", "1"]
        return [step, str(src), *cpu, *small, "--recompute", "--out", str(scratch / f"heads-{tag}.json")]
    raise ValueError(step)


def cli_measured(tree: Path, args: list[str], cache: Path, kill_above: int | None = None) -> dict:
    """``python -m surgery ARGS`` with the surgery of ``tree``, its cache in ``cache``: its peaks and time."""
    import os

    env = {**os.environ, "PYTHONPATH": str(tree), "SURGERY_CACHE": str(cache)}
    return measure([sys.executable, "-m", "surgery", *args], kill_above, cwd=tree, env=env)


def quantize_int4(src: Path, out: Path) -> Path:
    """A copy of ``src`` in bfloat16 with its decoder linears compressed to W4A16 (groups of 64), written
    beside and renamed."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from tests.support.int_packed import compress_folder

    if out.exists():
        return out
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(src, partial, ignore=shutil.ignore_patterns("*.gguf*"))
    tensors = {n: t.to(torch.bfloat16) for n, t in load_file(partial / "model.safetensors").items()}
    save_file(tensors, partial / "model.safetensors", metadata={"format": "pt"})
    compress_folder(partial, "w4a16-g64", torch.bfloat16)
    partial.rename(out)
    return out


def quantize_mxfp4(out: Path) -> Path:
    """A random gpt-oss of :data:`MXFP4_SIZES` with MXFP4 experts, written beside ``out`` and renamed."""
    import shutil

    from tests.support.mxfp4 import build_mxfp4

    if out.exists():
        return out
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    build_mxfp4(partial, **MXFP4_SIZES)
    partial.rename(out)
    return out


def meta_model(folder: Path):
    """``folder``'s model built on the meta device, without its quantization (every weight at full size)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    del config.quantization_config
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def widened_layers(folder: Path) -> list[float]:
    """Each decoder layer's weights in float32, MB: what its call widens."""
    return [sum(p.numel() for p in block.parameters()) * 4 / MB for block in meta_model(folder).model.layers]


def widened_mb(folder: Path) -> tuple[float, float]:
    """(the largest decoder layer's weights, the embedding table) in float32, from the model built on the
    meta device: what one layer's call widens, and what the embeddings and a tied head widened whole
    before model/vocab_table.py."""
    return max(widened_layers(folder)), meta_model(folder).get_input_embeddings().weight.numel() * 4 / MB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=Path.home() / ".cache/surgery/models/smollm2-135m-instruct")
    ap.add_argument("--source", type=Path, help="a quantized checkpoint measured as it is (no --format copy)")
    ap.add_argument("--old-tree", type=Path, help="a checkout whose loader is the one compared")
    ap.add_argument(
        "--format",
        choices=("nvfp4", "w4a16", "mxfp4"),
        default="nvfp4",
        help="NVFP4 or W4A16 (groups of 64) copy of --model, or a random gpt-oss with MXFP4 experts",
    )
    ap.add_argument("--steps", nargs="+", choices=STEPS, default=["load"], help="what is measured (default: load)")
    ap.add_argument("--pairs", type=int, default=8, help="find-neurons' pairs (default 8)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-rss-gb", type=float, help="stop a step whose RSS passes this (a shared machine's budget)")
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/surgery-bench-fp4"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", nargs=4, metavar=("TASK", "TREE", "SRC", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    steps = [s for s in STEPS if s in args.steps or (s == "bake" and "verify" in args.steps)]
    if args.old_tree is None and args.steps == ["load"]:
        ap.error("--old-tree is required to measure the load alone")
    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE))
    from bench_fp4 import quantize
    from machine import one_line, stamp

    machine = stamp()
    print("machine:", one_line(machine))
    args.scratch = args.scratch.resolve()  # the CLI steps run in the tree measured
    args.scratch.mkdir(parents=True, exist_ok=True)
    kind = args.format.upper()
    if args.source is not None:
        src = args.source.resolve()
        quantization = json.loads((src / "config.json").read_text()).get("quantization_config", {})
        kind = str(quantization.get("format") or quantization.get("quant_method") or "unquantized").upper()
    elif args.format == "w4a16":
        src = quantize_int4(args.model, args.scratch / f"{args.model.name}-w4a16")
    elif args.format == "mxfp4":
        src = quantize_mxfp4(args.scratch / "gpt-oss-mxfp4")
    else:
        src = quantize(args.model.resolve(), args.scratch / f"{args.model.name}-nvfp4")
    file_mb = sum(f.stat().st_size for f in src.glob("*.safetensors")) / MB
    from surgery.core.checkpoint import Checkpoint

    tensors = Checkpoint(src).tensors.values()
    packed = sum(t.nbytes for t in tensors if t.name.endswith(("_blocks", "_scales", "_packed", "_scale")))
    print(f"{src}: the packed weights (codes and scales) are {packed / MB:.1f} MB of the {file_mb:.1f} MB file")
    layer_mb, table_mb = widened_mb(src)
    trees = {"new": HERE.parent, **({"old": args.old_tree.resolve()} if args.old_tree else {})}
    pairs = small_pairs(src, args.scratch / "pairs.jsonl", args.pairs) if "find-neurons" in steps else Path()
    layers = len(widened_layers(src))
    config = json.loads((src / "config.json").read_text())
    experts = bool(config.get("num_local_experts") or config.get("num_experts"))
    runs = []
    cap = None if args.max_rss_gb is None else int(args.max_rss_gb * 1024**3)
    for k in range(args.runs):
        row = {"imports": measure([sys.executable, __file__, "--child", "imports", str(trees["new"]), str(src), "-"])}
        for step in steps:
            for path, tree in trees.items():
                if step == "load":
                    logits = args.scratch / f"logits-{kind}-{path}.pt"
                    cmd = [sys.executable, __file__, "--child", "load", str(tree), str(src), str(logits)]
                    row[f"load/{path}"] = measure(cmd, cap)
                else:
                    cmd = step_command(step, src, args.scratch, path, pairs, layers, experts)
                    row[f"{step}/{path}"] = cli_measured(tree, cmd, args.scratch / f"cache-{path}", cap)
                print(f"{step}/{path}: {json.dumps(row[f'{step}/{path}'])}", flush=True)
        runs.append(row)
        print(f"run {k}: " + ", ".join(f"{t} {r['wall_s']:.1f} s / {r['rss_mb']:.0f} MB" for t, r in row.items()))
    import torch

    same = None
    if "load" in steps and len(trees) == 2:
        same = torch.equal(*(torch.load(args.scratch / f"logits-{kind}-{p}.pt") for p in trees))
    med = {
        t: {m: statistics.median(r[t][m] for r in runs) for m in runs[0][t] if all(m in r[t] for r in runs)}
        for t in runs[0]
    }
    floor = med["imports"]
    target = 1.5 * file_mb + layer_mb
    print(
        f"{kind} weights file {file_mb:.1f} MB; the largest decoder layer in float32 {layer_mb:.1f} MB; target ≤ "
        f"1.5× the file + one layer = {target:.0f} MB above the imports; the embedding table in float32 "
        f"{table_mb:.1f} MB; imports {floor['rss_mb']:.0f} MB RSS, {floor['anon_mb']:.0f} MB anonymous"
    )

    def meets(mb: float) -> str:
        return "meets the target" if mb <= target else f"misses the target by {mb - target:.0f} MB"

    for name, m in med.items():
        if name == "imports":
            continue
        above = {k: m[k] - floor[k] for k in ("rss_mb", "anon_mb")}
        held = (
            f"held {m['held_bytes'] / MB:.1f} MB = {m['held_bytes'] / MB / file_mb:.2f}× the file; "
            if "held_bytes" in m
            else ""
        )
        load = ""
        if "load_rss_mb" in m:
            alone = m["load_rss_mb"] - floor["rss_mb"]
            load = f"load alone RSS {alone:.0f} MB = {alone / file_mb:.2f}× ({meets(alone)}); load + forward "
        if any(r[name].get("killed") for r in runs):
            mb = above["rss_mb"]
            print(
                f"{name}: stopped at the --max-rss-gb cap: at least {mb:.0f} MB above the imports = {mb / file_mb:.2f}× ({meets(mb)})"
            )
            continue
        times = f"load {m['load_s']:.1f} s, forward {m['forward_s']:.2f} s" if "load_s" in m else f"{m['wall_s']:.0f} s"
        print(
            f"{name}: {held}peak above the imports: {load}RSS {above['rss_mb']:.0f} MB = "
            f"{above['rss_mb'] / file_mb:.2f}× ({meets(above['rss_mb'])}), anonymous {above['anon_mb']:.0f} MB = "
            f"{above['anon_mb'] / file_mb:.2f}× ({meets(above['anon_mb'])}); {times}"
        )
    if len(trees) == 2:
        for step in steps:
            for metric in runs[0][f"{step}/new"]:
                if metric.endswith(("_mb", "_s")):
                    ratios = [r[f"{step}/new"][metric] / r[f"{step}/old"][metric] for r in runs]
                    print(
                        f"{step}: new / old {metric} (same run, median of {args.runs}): {statistics.median(ratios):.2f}×"
                    )
    if same is not None:
        print(f"logits new == old, bit for bit: {same}")
    if args.json:
        record = {
            "machine": machine,
            "source": str(src),
            "file_mb": file_mb,
            "layer_f32_mb": layer_mb,
            "table_f32_mb": table_mb,
            "target_mb": target,
            "runs": runs,
            "medians": med,
            "logits_equal": same,
        }
        args.json.write_text(json.dumps(record, indent=1))
    subprocess.run(["uptime"], check=False)


if __name__ == "__main__":
    main()
