"""vLLM (CPU build) serves a baked int4 W4A16 checkpoint as the same edit of its decompressed weights.

vLLM's CPU kernel runs W4A16 (pack-quantized int4, symmetric, groups of 32) in bfloat16 only; W8A16
(int8 codes) it refuses ("Quant type (uint8b128) not supported by CPUWNA16", vLLM 0.32). Needs a
virtual environment with vLLM, named by ``SURGERY_VLLM_PYTHON``; run with ``pytest -m vllm``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from surgery.bake.bake import bake
from surgery.bake.check import edited_check
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from tests.support.int_packed import build_int, dense_copy
from tests.support.paths import REPO
from tests.support.tokenizer import save_char_tokenizer

pytestmark = pytest.mark.vllm(minutes=10)  # measured: 10.3 min on 2 busy cores

# head_dim 32 = the group size: a head's o_proj columns are whole groups (scaled through their scales)
DIMS = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=512,
)
# Head 0 × 4 and every other neuron pruned, in both layers: every prompt's continuation changes.
RECIPE = Recipe(
    tuple(HeadScale(layer, 0, 4.0) for layer in range(2))
    + tuple(NeuronScale(layer, n, 0.0) for layer in range(2) for n in range(0, 128, 2))
)


def _greedy(python: str, model: Path, out: Path) -> list[list[int]]:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("PYTHONPATH", None)  # the vLLM environment brings its own transformers
    proc = subprocess.run(
        [python, str(REPO / "tests" / "support" / "vllm_greedy.py"), str(model), str(out)], env=env, timeout=900
    )
    assert proc.returncode == 0 and out.is_file(), f"vLLM did not serve {model.name} (see its output above)"
    return json.loads(out.read_text())


def _bake(src: Path, out: Path) -> Path:
    ckpt = Checkpoint(src)
    bake(ckpt, RECIPE, out, check=edited_check(ckpt, RECIPE))
    return out


def test_vllm_serves_a_baked_w4a16_checkpoint_as_the_edit_of_its_decompressed_weights(vllm_wna16_python, tmp_path):
    src = save_char_tokenizer(build_int(tmp_path / "src", "w4a16-g32", **DIMS))
    baked = _bake(src, tmp_path / "baked")
    # the reference: the same recipe baked into the decompressed (float32) source
    reference = _bake(dense_copy(src, tmp_path / "dense", "w4a16-g32"), tmp_path / "dense-baked")
    tokens = {m.name: _greedy(vllm_wna16_python, m, tmp_path / f"{m.name}.json") for m in (baked, reference, src)}
    assert tokens["baked"] == tokens["dense-baked"]
    assert all(a != b for a, b in zip(tokens["baked"], tokens["src"])), "the edit does not show"
