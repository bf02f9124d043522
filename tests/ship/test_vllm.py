"""vLLM serves a baked SmolLM2 exactly as transformers runs it, and the exported adapter equals it;
and a baked tiny mixture of experts (expert-neuron edits) as transformers runs it.

Needs the real model (``python examples/get_models.py``) and a separate virtual environment with
vLLM, named by ``SURGERY_VLLM_PYTHON`` (its python executable; .ci/run sets one up). Run with
``pytest -m vllm``. The heavy lifting is examples/vllm_check.py, run with that python.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from surgery.core.edits import HeadScale, Recipe
from tests.support.cli import run_cli
from tests.support.paths import REPO

pytestmark = pytest.mark.vllm(minutes=6)

# Silencing 4 heads in each of layers 1 and 2 changes every greedy continuation, and the adapter
# stays at rank 8 × 64 = 256 per module (vLLM's largest max_lora_rank is 512).
RECIPE = Recipe(tuple(HeadScale(layer, head, 0.0) for layer in (1, 2) for head in range(4)))


def _cli(*args: str) -> None:
    result = run_cli(args, timeout=600)
    assert result.returncode == 0, result.stderr


def test_vllm_serves_baked_checkpoint_and_adapter(smollm2, vllm_python, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.to_yaml(), encoding="utf-8")
    baked, adapter, report_path = tmp_path / "baked", tmp_path / "adapter", tmp_path / "report.json"
    _cli("apply", str(recipe), "--model", str(smollm2), "--out", str(baked))
    _cli("export-lora", str(smollm2), "--recipe", str(recipe), "--out", str(adapter), "--vllm")
    assert (baked / "surgery.undo").is_file() and (baked / "surgery.json").is_file()

    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("PYTHONPATH", None)  # the vLLM environment brings its own transformers
    proc = subprocess.run(
        [
            vllm_python,
            str(REPO / "examples" / "vllm_check.py"),
            "--source",
            str(smollm2),
            "--baked",
            str(baked),
            "--lora",
            str(adapter),
            "--json",
            str(report_path),
        ],
        env=env,
        timeout=1800,
    )
    report = json.loads(report_path.read_text())
    checks = report["checks"]
    # Our own files (surgery.json, surgery.undo: not *.safetensors) do not stop vLLM loading it.
    assert checks["vllm_loads_baked"], report.get("error")
    assert checks["vllm_equals_transformers_on_baked"], report["vllm_vs_transformers_first_difference"]
    assert checks["vllm_equals_transformers_on_source"]
    assert checks["baked_differs_from_source"], report["texts"]
    assert checks["vllm_lora_equals_baked"], report.get("lora_error") or report["lora_first_difference"]
    assert proc.returncode == 0


# A tiny Mixtral vLLM's CPU kernels accept (head_dim 32), random weights, per-expert layout as
# save_pretrained writes it; half the neurons of every expert ×4: an edit every prompt's greedy
# continuation shows (pruning them leaves one of the four prompts' continuations unchanged).
TINY_MOE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=512,
)


def test_vllm_serves_a_baked_tiny_moe(tiny, vllm_python, tmp_path):
    from surgery.core.edits import NeuronScale
    from tests.support.tokenizer import save_char_tokenizer

    src = save_char_tokenizer(tiny("mixtral", **TINY_MOE))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        Recipe(
            tuple(NeuronScale(layer, n, 4.0, e) for layer in range(2) for e in range(4) for n in range(32))
        ).to_yaml(),
        encoding="utf-8",
    )
    baked, report_path = tmp_path / "baked", tmp_path / "report.json"
    _cli("apply", str(recipe), "--model", str(src), "--out", str(baked))

    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("PYTHONPATH", None)
    subprocess.run(
        [
            vllm_python,
            str(REPO / "examples" / "vllm_check.py"),
            "--source",
            str(src),
            "--baked",
            str(baked),
            "--json",
            str(report_path),
        ],
        env=env,
        timeout=1800,
    )
    report = json.loads(report_path.read_text())
    checks = report["checks"]
    assert checks["vllm_loads_baked"], report.get("error")
    assert checks["vllm_equals_transformers_on_baked"], report["vllm_vs_transformers_first_difference"]
    assert checks["vllm_equals_transformers_on_source"]
    assert checks["baked_differs_from_source"], report["texts"]
