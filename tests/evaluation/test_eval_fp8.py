"""surgery eval on an FP8 checkpoint, on a CPU: it runs the model dequantized (it was refused before
loading) and measures what its float32 copy measures, under the FP8 checkpoint's own fingerprint."""

from __future__ import annotations

import pytest
import torch

import surgery
from surgery.core.checkpoint import Checkpoint
from tests.support.fp8 import build_fp8, dequantized_copy
from tests.support.tokenizer import TINY_VOCAB, save_char_tokenizer


@pytest.mark.parametrize("rest", ["float32", "bfloat16"], ids=["dequantized-whole", "held-layerwise"])
def test_eval_of_an_fp8_checkpoint_is_its_float32_copy_s(tmp_path, rest):
    src = build_fp8(
        tmp_path / "fp8",
        "block",
        (24, 24),
        rest=getattr(torch, rest),
        vocab_size=TINY_VOCAB,
        max_position_embeddings=512,
    )
    save_char_tokenizer(src)
    copy = dequantized_copy(src, tmp_path / "fp32", "block", (24, 24))
    on_fp8, on_copy = (surgery.evaluate(m, device="cpu", limit=4) for m in (src, copy))
    assert on_fp8.model.fingerprint == Checkpoint(src).fingerprint()
    assert on_fp8.metrics == on_copy.metrics and on_fp8.details == on_copy.details
