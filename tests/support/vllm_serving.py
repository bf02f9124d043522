"""vLLM serving checks (-m vllm): a tiny model whose int4 weights vLLM's CPU kernel runs, the recipe every
check bakes, and greedy tokens from the vLLM environment (a subprocess: vLLM brings its own transformers)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from surgery.bake.bake import bake
from surgery.bake.check import edited_check
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from tests.support.paths import REPO

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


def greedy_tokens(python: str, model: Path, out: Path) -> list[list[int]]:
    """Each prompt's greedy continuation by vLLM (``python``: the vLLM environment's) of ``model``."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("PYTHONPATH", None)  # the vLLM environment brings its own transformers
    proc = subprocess.run(
        [python, str(REPO / "tests" / "support" / "vllm_greedy.py"), str(model), str(out)], env=env, timeout=900
    )
    assert proc.returncode == 0 and out.is_file(), f"vLLM did not serve {model.name} (see its output above)"
    return json.loads(out.read_text())


def bake_recipe(src: Path, out: Path) -> Path:
    """:data:`RECIPE` baked into ``src`` at ``out`` (checked as every bake is)."""
    ckpt = Checkpoint(src)
    bake(ckpt, RECIPE, out, check=edited_check(ckpt, RECIPE))
    return out
