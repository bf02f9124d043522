#!/usr/bin/env python3
"""Benchmark: ``surgery prune-neurons MODEL --n 40`` (find + bake in one command) against a plain batched forward.

    python examples/bench_gguf_e2e.py MODEL [--n 40] [--category C ...] [--runs 1] [--threads T] [--json FILE]
    python examples/bench_gguf_e2e.py --make fp8|int4 [SMOLLM2_FOLDER] ...

MODEL: a .gguf file or a safetensors folder (an FP8 or compressed-tensors one). ``--make`` first writes
such a folder from SmolLM2-135M-Instruct with the formats' own tools (examples/bench_upcast.py's FP8
block quantizer, blocks of 64; compressed-tensors' W4A16 compressor, as tests/support/int_packed.py
uses it).

Interleaved, each in a fresh child process on a warm page cache, with the child's peak RSS from
``os.wait4``:

* ``surgery``: ``python -m surgery prune-neurons MODEL --n N --out OUT`` with an empty surgery cache (a
  GGUF is imported, every prompt captured, the neurons scored and baked, the bake checked), with its
  phases timed in the child: import (GGUF → float32 safetensors), load (tokenizer and model), capture,
  scoring (the rest of the find), bake and, within it, the check;
* ``plain``: what transformers alone does with the same prompts: ``from_pretrained`` (a GGUF dequantized
  by ``GgufConfig``-less ``gguf_file`` loading, as transformers loads it; an FP8 folder dequantized by
  transformers' FP8 loader, a compressed-tensors one decompressed on load) and the tokenizer, then the same
  prompts, the same batches (``2 × batch size`` texts, padded on the right), through the model's base
  (the decoder without ``lm_head``, which the capture never runs either).

Printed: wall seconds, CPU seconds (user + system: the fairer comparison on a shared machine), peak
RSS, the model's float32 size (its parameters × 4 bytes), the ratios surgery / plain (time and CPU) and
peak RSS / float32 size, the phase breakdown and the ``machine:`` line; ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import stamp

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("SURGERY_MODELS", Path.home() / ".cache" / "surgery" / "models"))

PROMPTS_CHILD = """
import json, sys
from surgery.find.neurons.pairs import builtin_text, load_pairs
# The builtin pairs of the chosen categories as a pairs file of our format: prune-neurons captures
# exactly these (its --category only selects among findings over every pair it captured).
wanted = set(sys.argv[3:])
lines = [l for l in builtin_text("en").splitlines() if l.strip() and (not wanted or json.loads(l)["category"] in wanted)]
open(sys.argv[2], "w").write("\\n".join(lines) + "\\n")
pairs = load_pairs(sys.argv[2])
json.dump([t for p in pairs.pairs for t in (p.prompt_1, p.prompt_2)], open(sys.argv[1], "w"))
"""

# The surgery child: the CLI as a user runs it, with timers around the functions each phase is. The
# check of a GGUF bake is computing and checking its edited blocks (``prepare``); of a folder bake, the
# hook ``edited_check`` returns, run on the staged output.
SURGERY_CHILD = """
import functools, importlib, json, sys, time
PHASES = {
    "import": [("surgery.gguf.importing", "import_gguf")],
    "load": [("surgery.find.neurons.find", "load_tokenizer"), ("surgery.find.neurons.find", "load_model")],
    "capture": [("surgery.find.neurons.find", "accumulate_pair_sums")],
    "find": [("surgery.api.neurons", "neuron_findings")],
    "bake": [("surgery.api.neurons", "bake_plans")],
    "check": [("surgery.bake.gguf", "prepare")],
}
spent = dict.fromkeys(PHASES, 0.0)
def timed(phase, f):
    @functools.wraps(f)
    def run(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[phase] += time.perf_counter() - t
    return run
for phase, places in PHASES.items():
    for module, name in places:
        m = importlib.import_module(module)
        setattr(m, name, timed(phase, getattr(m, name)))
check = importlib.import_module("surgery.bake.check")
made = check.edited_check
check.edited_check = lambda *a, **k: timed("check", made(*a, **k))
from surgery.cli.main import main
try:
    main(sys.argv[1:])
finally:
    print("PHASES " + json.dumps(spent), file=sys.stderr)
"""

PLAIN_CHILD = """
import json, sys, time
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model_path, prompts, batch = Path(sys.argv[1]), json.load(open(sys.argv[2])), 2 * int(sys.argv[3])
t = time.perf_counter()
if model_path.suffix.lower() == ".gguf":
    where, kw = str(model_path.parent), {"gguf_file": model_path.name}
else:
    where, kw = str(model_path), {}
quant = json.loads((model_path / "config.json").read_text()).get("quantization_config", {}) if not kw else {}
if quant.get("quant_method") == "compressed-tensors":
    # transformers keeps these weights packed by default, and the packed modules' CPU forward fails:
    # decompressed on load instead, to float32 as surgery loads them.
    from transformers import CompressedTensorsConfig
    kw["quantization_config"] = CompressedTensorsConfig(run_compressed=False)
model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kw)
tokenizer = AutoTokenizer.from_pretrained(where, **kw)
if tokenizer.pad_token is None:
    tokenizer.pad_token = tokenizer.eos_token
loaded = time.perf_counter()
base = model.get_decoder()
with torch.inference_mode():
    for a in range(0, len(prompts), batch):
        enc = tokenizer(prompts[a : a + batch], return_tensors="pt", padding=True, padding_side="right")
        base(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], use_cache=False)
done = time.perf_counter()
size = sum(p.numel() for p in model.parameters()) * 4
print(json.dumps({"load": loaded - t, "forward": done - loaded, "float32_bytes": size}))
"""


def run_child(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float, str, str]:
    """(wall seconds, CPU seconds, peak RSS in MB, stdout, stderr) of ``cmd``, its CPU time (user +
    system) and RSS from ``os.wait4``."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} … failed:\n{stderr[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, stdout, stderr


def make_model(kind: str, src: Path, scratch: Path) -> Path:
    """SmolLM2 at ``src`` quantized by ``kind``'s tool into ``scratch`` (kept there across runs)."""
    sys.path.insert(0, str(REPO))  # tests/support holds the compressed-tensors helper
    from bench_upcast import quantize_fp8, quantize_int4

    if kind == "fp8":
        # transformers' FP8 loader (the plain side) needs every weight's shape to be a multiple of the
        # block: SmolLM2's 576 is not one of 128, so blocks of 64.
        out = scratch / f"{src.name}-fp8-b64"
        quantize_fp8(src, out, block=64)
        for extra in src.iterdir():  # the tokenizer and templates (quantize_fp8 copies the JSON files)
            if extra.is_file() and not (out / extra.name).exists():
                (out / extra.name).write_bytes(extra.read_bytes())
        return out
    return quantize_int4(src, scratch / f"{src.name}-{kind}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", type=Path, default=None)
    ap.add_argument("--make", choices=["fp8", "int4"], default=None)
    ap.add_argument("--scratch", type=Path, default=MODELS / ".bench")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument(
        "--category",
        action="append",
        default=[],
        help="only the builtin pairs of these categories, captured by both sides (shorter runs)",
    )
    ap.add_argument("--batch-size", type=int, default=16, help="pairs per forward pass (find-neurons' default)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument(
        "--threads", type=int, default=None, help="OMP_NUM_THREADS for both children (default: torch's own choice)"
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    model = args.model
    if args.make:
        model = make_model(args.make, model or MODELS / "smollm2-135m-instruct", args.scratch)
    if model is None or not model.exists():
        raise SystemExit(f"{model} not found; run `python examples/get_models.py` first")
    machine = stamp()
    gguf = model.suffix.lower() == ".gguf"
    rows: dict[str, list[dict]] = {"surgery": [], "plain": []}
    with tempfile.TemporaryDirectory(prefix="bench-gguf-e2e-") as tmp:
        tmp = Path(tmp)
        env = dict(os.environ, PYTHONPATH=str(REPO), TQDM_DISABLE="1")
        if args.threads:  # on a shared machine, one thread each keeps idle OpenMP threads from spinning
            env["OMP_NUM_THREADS"] = str(args.threads)
        prompts = tmp / "prompts.json"
        pairs_file = tmp / "pairs.jsonl"
        run_child([sys.executable, "-c", PROMPTS_CHILD, str(prompts), str(pairs_file), *args.category], env)
        n_prompts = len(json.loads(prompts.read_text()))
        for i in range(args.runs):
            out = tmp / f"out{i}{'.gguf' if gguf else ''}"
            cmd = [sys.executable, "-c", SURGERY_CHILD, "prune-neurons", str(model), "--n", str(args.n)]
            cmd += ["--out", str(out), "--batch-size", str(args.batch_size), "--device", "cpu"]
            cmd += ["--pairs", str(pairs_file)]
            wall, cpu, rss, _, err = run_child(cmd, dict(env, SURGERY_CACHE=str(tmp / f"cache{i}")))
            phases = json.loads(err.rsplit("PHASES ", 1)[1].splitlines()[0])
            rows["surgery"].append({"s": wall, "cpu_s": cpu, "rss_mb": rss, "phases": phases})
            print(f"run {i} surgery: {json.dumps(rows['surgery'][-1])}", flush=True)  # kept if a later child dies
            cmd = [sys.executable, "-c", PLAIN_CHILD, str(model), str(prompts), str(args.batch_size)]
            wall, cpu, rss, printed, _ = run_child(cmd, env)
            rows["plain"].append(
                {"s": wall, "cpu_s": cpu, "rss_mb": rss, **json.loads(printed.strip().splitlines()[-1])}
            )
            print(f"run {i} plain: {json.dumps(rows['plain'][-1])}", flush=True)
    f32_mb = rows["plain"][0]["float32_bytes"] / 2**20
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("s", "cpu_s", "rss_mb")} for k, v in rows.items()}
    phases = {p: statistics.median(r["phases"][p] for r in rows["surgery"]) for p in rows["surgery"][0]["phases"]}
    plain_load = statistics.median(r["load"] for r in rows["plain"])
    plain_fwd = statistics.median(r["forward"] for r in rows["plain"])
    summary = {
        "machine": machine,
        "model": model.name,
        "prompts": n_prompts,
        "n": args.n,
        "runs": args.runs,
        "threads": args.threads,
        "float32_mb": round(f32_mb, 1),
        "surgery": {k: round(v, 2) for k, v in med["surgery"].items()},
        "plain": {k: round(v, 2) for k, v in med["plain"].items()},
        "plain_phases": {"load": round(plain_load, 2), "forward": round(plain_fwd, 2)},
        "time_ratio": round(med["surgery"]["s"] / med["plain"]["s"], 2),
        "cpu_ratio": round(med["surgery"]["cpu_s"] / med["plain"]["cpu_s"], 2),
        "rss_ratio": round(med["surgery"]["rss_mb"] / f32_mb, 2),
        "plain_rss_ratio": round(med["plain"]["rss_mb"] / f32_mb, 2),
        "phases": {
            "import": round(phases["import"], 2),
            "load": round(phases["load"], 2),
            "capture": round(phases["capture"], 2),
            "scoring": round(phases["find"] - phases["import"] - phases["load"] - phases["capture"], 2),
            "bake": round(phases["bake"] - phases["check"], 2),
            "check": round(phases["check"], 2),
        },
    }
    print(f"{model.name}: {n_prompts} prompts, --n {args.n}, float32 size {f32_mb:.0f} MB, median of {args.runs}")
    print(f"{'':8} {'seconds':>8} {'CPU s':>8} {'peak RSS MB':>12} {'RSS / f32':>10}")
    for name in ("surgery", "plain"):
        m = med[name]
        print(f"{name:8} {m['s']:8.1f} {m['cpu_s']:8.1f} {m['rss_mb']:12.0f} {m['rss_mb'] / f32_mb:10.2f}")
    # CPU seconds hold when other jobs share the machine (wall time does not): compare both.
    print(f"surgery / plain: {summary['time_ratio']:.2f}× time, {summary['cpu_ratio']:.2f}× CPU")
    print("surgery phases (s): " + ", ".join(f"{k} {v:.1f}" for k, v in summary["phases"].items()))
    print(f"plain phases (s): load {plain_load:.1f}, forward {plain_fwd:.1f}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
