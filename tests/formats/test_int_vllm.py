"""vLLM (CPU build) serves a baked int4 W4A16 checkpoint as the same edit of its decompressed weights.

vLLM's CPU kernel runs W4A16 (pack-quantized int4, symmetric, groups of 32) in bfloat16 only; W8A16
(int8 codes) it refuses ("Quant type (uint8b128) not supported by CPUWNA16", vLLM 0.32). Needs a
virtual environment with vLLM, named by ``SURGERY_VLLM_PYTHON``; run with ``pytest -m vllm``.
"""

from __future__ import annotations

import pytest

from tests.support.int_packed import build_int, dense_copy
from tests.support.tokenizer import save_char_tokenizer
from tests.support.vllm_serving import DIMS, assert_serves_the_edit, bake_recipe

pytestmark = pytest.mark.vllm(minutes=10)  # measured: 10.3 min on 2 busy cores


def test_vllm_serves_a_baked_w4a16_checkpoint_as_the_edit_of_its_decompressed_weights(vllm_wna16_python, tmp_path):
    src = save_char_tokenizer(build_int(tmp_path / "src", "w4a16-g32", **DIMS))
    baked = bake_recipe(src, tmp_path / "baked")
    # the reference: the same recipe baked into the decompressed (float32) source
    reference = bake_recipe(dense_copy(src, tmp_path / "dense", "w4a16-g32"), tmp_path / "dense-baked")
    assert_serves_the_edit(vllm_wna16_python, baked, reference, src, tmp_path)
