#!/usr/bin/env python3
"""Benchmark: heretic-llm's saved model vs surgery's bake, same direction, same per-layer weights.

    python examples/bench_heretic.py [--model DIR] [--work DIR] [--venvs DIR] [--json FILE]

heretic (AGPL-3.0) is installed from PyPI into the benchmark's own environment
(examples/bench_venv.py, under ``--venvs``; never a dependency of surgery) and run there in a child
process; nothing of it is copied here. When the model or PyPI is missing the script says so in one
line and exits 0.

heretic's CLI picks its parameters by an Optuna search and saves through interactive menus, and it
always computes its own directions from its prompt sets. To apply *given* parameters to a *given*
direction, the child drives heretic's own classes the way its CLI does after a trial is chosen
(``heretic.model.Model``: load with LoRA adapters, ``abliterate``, ``get_merged_model``,
``save_pretrained``), with ``row_normalization = none`` (heretic's default ``full`` renormalises
rows through a rank-3 SVD: another edit) and the direction handed in as every layer's refusal
direction. Ours is ``surgery ablate-direction`` with the same layer, weight, position, floor and width.

The direction is surgery's (find-direction on examples/directions/: Spanish vs English questions,
the same text files heretic reads as its bad/good prompts). heretic's own directions from those
files (its ``get_residuals_mean``, not projected, with the system prompt SmolLM2's template puts in
when there is none, so both read the same text) are compared with ours by cosine.

Measured, for SmolLM2-135M-Instruct in float32 and in a bfloat16 copy:

* max |Δlogit| between heretic's saved model and our bake on fixed prompts, both run in float32,
  next to the bf16 scale: max |Δlogit| between our bf16 and our fp32 bake;
* wall time and peak RSS of each tool's writing process (load, edit, save; ours also verifies);
* bytes written (weights, and the whole folder), and whether a rerun is byte-identical (sha256 of
  the weight files);

and for a tiny random Qwen3-MoE (one dense layer, then 4 experts a layer): which tensors each edits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from machine import stamp

REPO = Path(__file__).resolve().parent.parent
HERE = REPO / "examples" / "directions"
sys.path.insert(0, str(REPO / "examples"))
MODELS = Path(os.environ.get("SURGERY_MODELS", Path.home() / ".cache" / "surgery" / "models"))
HERETIC = "heretic-llm==1.4.0"
KERNEL = dict(weight=1.0, floor=0.2, width=8)  # peak at the direction's layer; heretic's kernel has the same shape
# The system prompt SmolLM2's chat template inserts when a chat has none: heretic always sends one.
SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
FIXED_PROMPTS = [
    "The capital of France is",
    "¿Cuál es la capital de Francia?",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
]

# Runs in heretic's environment: sys.argv[1] is the job (JSON). heretic's Settings parse the command
# line, so the job leaves none behind; the working directory is a scratch folder (no config.toml).
CHILD = r"""
import json, sys
job = json.loads(sys.argv[1]); del sys.argv[1:]
import torch, torch.nn.functional as F
from safetensors.torch import load_file
from heretic.config import Settings
from heretic.model import AbliterationParameters, Model
from heretic.utils import load_prompts
torch.set_grad_enabled(False)
settings = Settings(
    model=job["model"], dtypes=["auto"], device_map="cpu", batch_size=8, row_normalization="none",
    orthogonalize_direction=False, system_prompt=job["system"],
    good_prompts={"dataset": job["good"]}, bad_prompts={"dataset": job["bad"]},
)
model = Model(settings)
layers = len(model.get_layers())
if job["mode"] == "directions":
    good = model.get_residuals_mean(load_prompts(settings, settings.good_prompts))
    bad = model.get_residuals_mean(load_prompts(settings, settings.bad_prompts))
    ours = load_file(job["vectors"])
    theirs = F.normalize(bad - good, p=2, dim=1)[1:]  # row 0 is the embeddings
    cos = [float(theirs[l] @ F.normalize(ours[f"layer.{l}"].float(), dim=0)) for l in range(layers)]
    print("RESULT " + json.dumps({"cosine": cos}))
else:
    r = load_file(job["vectors"])[job["name"]].float()
    directions = r.expand(layers + 1, -1).clone()  # the same direction at every index
    k = job["kernel"]
    params = AbliterationParameters(max_weight=k["weight"], max_weight_position=float(k["position"]),
                                    min_weight=k["floor"], min_weight_distance=float(k["width"]))
    model.abliterate(directions, float(job["layer"]), {c: params for c in model.get_abliterable_components()})
    merged = model.get_merged_model()
    merged.save_pretrained(job["out"], max_shard_size=settings.max_shard_size)
    model.tokenizer.save_pretrained(job["out"])
    print("RESULT " + json.dumps({"components": model.get_abliterable_components()}))
"""


# Runs the measured command and reports its peak RSS. Why a middleman: a child's ru_maxrss starts at
# the RSS its parent had when it forked, and this script holds models; this small process forks clean.
TIMED = r"""
import os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(proc.pid, 0)
print(f"PEAK_RSS_KB {usage.ru_maxrss}", flush=True)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_measured(cmd: list[str], cwd: Path | None = None) -> dict:
    """Run ``cmd``; its wall time, its own peak RSS and its last RESULT line."""
    start = time.perf_counter()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-c", TIMED, *cmd],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wall = time.perf_counter() - start
    lines = proc.stdout.splitlines()
    if proc.returncode:
        tail = "\n".join(lines[-15:])
        raise RuntimeError(f"{' '.join(cmd[:4])} … failed:\n{tail}")
    results = [ln[7:] for ln in lines if ln.startswith("RESULT ")]
    peak = [int(ln.split()[1]) for ln in lines if ln.startswith("PEAK_RSS_KB ")]
    return {
        "seconds": round(wall, 1),
        "peak_rss_mb": round(peak[-1] / 1024),
        "result": json.loads(results[-1]) if results else None,
    }


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def footprint(folder: Path) -> dict:
    files = [p for p in folder.rglob("*") if p.is_file()]
    return {
        "weights_bytes": sum(p.stat().st_size for p in weight_files(folder)),
        "folder_bytes": sum(p.stat().st_size for p in files),
        "sha256": {p.name: sha256(p) for p in weight_files(folder)},
    }


def bf16_copy(src: Path, dst: Path) -> Path:
    """``src`` with every floating tensor stored in bfloat16 (the dtype SmolLM2 is published in)."""
    import torch
    from safetensors.torch import load_file, save_file

    if (dst / "model.safetensors").exists():
        return dst
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file() and item.suffix != ".safetensors" and not item.name.startswith("surgery"):
            shutil.copy2(item, dst / item.name)
    tensors = {
        k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in load_file(src / "model.safetensors").items()
    }
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((dst / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return dst


def tiny_qwen3_moe(dst: Path, tokenizer_from: Path) -> Path:
    """A random Qwen3-MoE like Qwen3-30B-A3B (every layer sparse): 4 layers of 4 experts (top 2), SmolLM2's tokenizer."""
    import torch
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    if (dst / "config.json").exists():
        return dst
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_experts=4, num_experts_per_tok=2, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, mlp_only_layers=[], decoder_sparse_step=1,
        max_position_embeddings=512, tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config).to(torch.float32)
    model.save_pretrained(dst)
    tokenizer.save_pretrained(dst)
    return dst


def find(model: Path, out: Path) -> tuple[Path, int]:
    """Our direction findings for ``model`` (Spanish vs English) and the best-separating layer."""
    import surgery

    found = surgery.find_direction(
        model, a=HERE / "es_questions.txt", b=HERE / "en_questions.txt", out=out / "direction.json", device="cpu"
    )
    return out / "direction.json", found.data.best_layer


def ours(model: Path, direction: Path, layer: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "surgery", "ablate-direction", str(model), "--direction", str(direction)]
    cmd += ["--direction-layer", str(layer), "--position", str(layer), "--weight", str(KERNEL["weight"])]
    cmd += ["--floor", str(KERNEL["floor"]), "--width", str(KERNEL["width"]), "--device", "cpu"]
    cmd += ["--out", str(out), "--force"]
    return run_measured(cmd, cwd=REPO) | footprint(out)


def heretic_job(python: Path, scratch: Path, **job) -> dict:
    scratch.mkdir(parents=True, exist_ok=True)
    return run_measured([str(python), "-c", CHILD, json.dumps(job)], cwd=scratch)


def theirs(python: Path, model: Path, direction: Path, layer: int, out: Path, scratch: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    vectors = direction.with_suffix(".safetensors")
    job = dict(mode="save", model=str(model), out=str(out), vectors=str(vectors), name=f"layer.{layer}", layer=layer)
    job |= dict(kernel=KERNEL | {"position": layer}, system=SMOLLM_SYSTEM)
    job |= dict(good=str(HERE / "en_questions.txt"), bad=str(HERE / "es_questions.txt"))
    return heretic_job(python, scratch, **job) | footprint(out)


def logits(folder: Path, tokenizer_from: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_from)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return [model(**tok(p, return_tensors="pt")).logits[0] for p in FIXED_PROMPTS]


def max_diff(a, b) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def changed(source: Path, edited: Path) -> dict[str, int]:
    """The tensors of ``edited`` that differ from ``source``, by name pattern (indices → *), counted."""
    from safetensors.torch import load_file

    before = {k: v for f in weight_files(source) for k, v in load_file(f).items()}
    after = {k: v for f in weight_files(edited) for k, v in load_file(f).items()}
    counts: dict[str, int] = {}
    for name, tensor in after.items():
        if name not in before or not before[name].equal(tensor.to(before[name].dtype)):
            key = re.sub(r"\.\d+\.", ".*.", re.sub(r"\.\d+\.", ".*.", name))
            counts[key] = counts.get(key, 0) + 1
    return counts


def differing(a: Path, b: Path) -> dict:
    """How many stored weights of ``a`` and ``b`` differ, and the largest difference."""
    from safetensors.torch import load_file

    first = {k: v for f in weight_files(a) for k, v in load_file(f).items()}
    second = {k: v for f in weight_files(b) for k, v in load_file(f).items()}
    count, total, largest = 0, 0, 0.0
    for name, x in first.items():
        delta = (x.float() - second[name].float()).abs()
        count, total = count + int((delta > 0).sum()), total + x.numel()
        largest = max(largest, float(delta.max()))
    return {"count": count, "of": total, "max_abs": largest}


def dense(python: Path, model: Path, work: Path, tag: str) -> dict:
    direction, layer = find(model, work / f"find-{tag}")
    row = {"direction_layer": layer}
    for run in (1, 2):
        row[f"ours_{run}"] = ours(model, direction, layer, work / f"ours-{tag}-{run}")
        row[f"heretic_{run}"] = theirs(python, model, direction, layer, work / f"heretic-{tag}-{run}", work / "scratch")
    for side in ("ours", "heretic"):
        row[f"{side}_rerun_identical"] = row[f"{side}_1"]["sha256"] == row[f"{side}_2"]["sha256"]
    row["max_abs_dlogit"] = max_diff(logits(work / f"ours-{tag}-1", model), logits(work / f"heretic-{tag}-1", model))
    row["changed_ours"] = changed(model, work / f"ours-{tag}-1")
    row["changed_heretic"] = changed(model, work / f"heretic-{tag}-1")
    row["weights_differing"] = differing(work / f"ours-{tag}-1", work / f"heretic-{tag}-1")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MODELS / "smollm2-135m-instruct")
    parser.add_argument("--work", type=Path, default=Path("bench-heretic"))
    parser.add_argument("--venvs", type=Path, default=None, help="Where the benchmark's environments live.")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not (args.model / "config.json").exists():
        print(f"skipped: no model at {args.model} (python examples/get_models.py --only smollm2)")
        return
    machine = stamp()
    if args.venvs is not None:
        os.environ["SURGERY_BENCH_VENVS"] = str(args.venvs)
    import bench_venv

    try:
        python = bench_venv.ensure("heretic", HERETIC)
    except bench_venv.Unavailable as why:
        print(f"skipped: heretic cannot be installed: {why}")
        return
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    summary: dict = {"heretic": HERETIC, "kernel": KERNEL}
    fp32 = args.model
    bf16 = bf16_copy(fp32, work / "smollm2-bf16")
    summary["fp32"] = dense(python, fp32, work, "fp32")
    summary["bf16"] = dense(python, bf16, work, "bf16")
    # The bf16 scale: what rounding to bf16 alone does to the logits of our bake.
    summary["bf16_rounding_dlogit"] = max_diff(logits(work / "ours-fp32-1", fp32), logits(work / "ours-bf16-1", fp32))
    direction = work / "find-fp32" / "direction.json"
    cos = heretic_job(
        python, work / "scratch", mode="directions", model=str(fp32), vectors=str(direction.with_suffix(".safetensors")),
        system=SMOLLM_SYSTEM, good=str(HERE / "en_questions.txt"), bad=str(HERE / "es_questions.txt"),
    )["result"]["cosine"]  # fmt: skip
    summary["direction_cosine"] = {"min": min(cos), "at_layer": cos[summary["fp32"]["direction_layer"]], "all": cos}
    moe = tiny_qwen3_moe(work / "tiny-qwen3-moe", fp32)
    m_direction, m_layer = find(moe, work / "find-moe")
    m_layer = max(1, min(m_layer, 2))  # an MoE layer with room for heretic's interpolation
    ours(moe, m_direction, m_layer, work / "ours-moe")
    theirs(python, moe, m_direction, m_layer, work / "heretic-moe", work / "scratch")
    summary["moe"] = {
        "direction_layer": m_layer,
        "changed_ours": changed(moe, work / "ours-moe"),
        "changed_heretic": changed(moe, work / "heretic-moe"),
    }
    summary["machine"] = machine
    text = json.dumps(summary, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
