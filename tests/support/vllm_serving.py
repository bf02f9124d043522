"""vLLM serving checks (-m vllm): a tiny model whose int4 weights vLLM's CPU kernel runs, the recipe every
check bakes, and what vLLM makes of a model (greedy tokens, teacher-forced log-probabilities) from the vLLM
environment (a subprocess: vLLM brings its own transformers)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Served:
    """What vLLM made of one model: greedy continuations and teacher-forced log-probabilities."""

    greedy: list[list[int]]
    logprobs: list[list[list[float]]]  # sequence × position × vocabulary entry

    def gap(self, other: Served) -> float:
        """The largest absolute difference of the two models' log-probabilities, over every vocabulary entry
        at every position of every sequence."""
        return max(
            abs(a - b)
            for seq_a, seq_b in zip(self.logprobs, other.logprobs, strict=True)
            for pos_a, pos_b in zip(seq_a, seq_b, strict=True)
            for a, b in zip(pos_a, pos_b, strict=True)
        )


def served(python: str, model: Path, out: Path) -> Served:
    """What vLLM (``python``: the vLLM environment's) makes of ``model``."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("PYTHONPATH", None)  # the vLLM environment brings its own transformers
    proc = subprocess.run(
        [python, str(REPO / "tests" / "support" / "vllm_generate.py"), str(model), str(out)], env=env, timeout=900
    )
    assert proc.returncode == 0 and out.is_file(), f"vLLM did not serve {model.name} (see its output above)"
    return Served(**json.loads(out.read_text()))


def bake_recipe(src: Path, out: Path) -> Path:
    """:data:`RECIPE` baked into ``src`` at ``out`` (checked as every bake is)."""
    ckpt = Checkpoint(src)
    bake(ckpt, RECIPE, out, check=edited_check(ckpt, RECIPE))
    return out


# Measured with vLLM 0.32: on an Intel Xeon (AVX-512, AMX) the same model through the int4 and the dense
# bfloat16 kernels differs by about 0.01 (the unedited source against its own decompressed copy: 0.008-0.010),
# on an AVX-512 AMD EPYC by 0.0; the edit moves the largest log-probability by 0.83 (the models are built
# from fixed seeds: the same on every CPU). A bfloat16 logit near 1 is kept to 0.004, so another order of
# summation may move a log-probability by a few of those: the bounds leave room for that on CPUs not measured.
SAME_MODEL_GAP = 0.15
EDIT_GAP = 0.4


def assert_serves_the_edit(python: str, baked: Path, reference: Path, src: Path, tmp: Path) -> None:
    """vLLM serves ``baked`` as it serves ``reference`` (the same recipe baked into decompressed weights),
    and both unlike ``src``. Compared by log-probabilities: bfloat16 kernels that sum in different orders
    part greedy tokens at near-ties even for one model, so tokens only show that the edit took."""
    runs = {m.name: served(python, m, tmp / f"{m.name}.json") for m in (baked, reference, src)}
    mine, theirs, source = runs[baked.name], runs[reference.name], runs[src.name]
    assert mine.gap(theirs) <= SAME_MODEL_GAP, f"baked vs. reference: {mine.gap(theirs):.4f}"
    assert mine.gap(source) > EDIT_GAP, f"the edit does not show: baked vs. source {mine.gap(source):.4f}"
    assert all(a != b for a, b in zip(mine.greedy, source.greedy, strict=True)), "a continuation did not change"
