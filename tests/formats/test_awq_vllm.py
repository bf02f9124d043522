"""vLLM (CPU build) serves a baked AutoAWQ GEMM checkpoint as the same edit of its decompressed weights.

vLLM 0.32 runs AutoAWQ's int4 codes with zero points on a CPU (its CPUWNA16 kernel, sizes multiples of 32) in
bfloat16, casting the F16 scales to bfloat16: with F16 scales that bfloat16 does not hold, the tokens of the
AWQ model and of its decompressed float32 weights part within 12 tokens (measured), an artefact of the cast,
not of the edit. The test model's scales are powers of two: every weight is then exact in both, and the two
runs differ only by the kernels' order of summation (compared by log-probabilities, see vllm_serving).
Needs a virtual environment with vLLM, named by ``SURGERY_VLLM_PYTHON``; run with ``pytest -m vllm``.
"""

from __future__ import annotations

import pytest

from tests.support.awq import build_awq, dense_copy
from tests.support.tokenizer import save_char_tokenizer
from tests.support.vllm_serving import DIMS, assert_serves_the_edit, bake_recipe

pytestmark = pytest.mark.vllm(minutes=10)


def test_vllm_serves_a_baked_awq_checkpoint_as_the_edit_of_its_decompressed_weights(vllm_wna16_python, tmp_path):
    # groups of 32 = head_dim: head 0's o_proj columns are whole groups (× 4 through their F16 scales)
    src = save_char_tokenizer(build_awq(tmp_path / "src", group=32, pow2=True, **DIMS))
    baked = bake_recipe(src, tmp_path / "baked")
    # the reference: the same recipe baked into the decompressed (float32) source
    reference = bake_recipe(dense_copy(src, tmp_path / "dense"), tmp_path / "dense-baked")
    assert_serves_the_edit(vllm_wna16_python, baked, reference, src, tmp_path)
