"""SmolLM2-135M-Instruct compressed by compressed-tensors as W4A16 (as llm-compressor writes it, its other
tensors bfloat16): held in 16 bits for float32 compute, it gives transformers' own decompression's logits
to float32 summation order (bit for bit on an AVX2 CPU; another kernel path may sum in another order), at
half the memory."""

from __future__ import annotations

import pytest
import torch

from surgery.model.dequantized import holds_codes
from surgery.model.loading import LoadSpec, load_model
from tests.support.int_packed import compress_folder
from tests.support.models import assert_same_function

pytest.importorskip("compressed_tensors")
pytestmark = pytest.mark.slow(minutes=1)


def test_smollm2_w4a16_held_computes_as_transformers_decompression(smollm2, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    import surgery.formats.int_packed.hold as int_dequantized

    folder = tmp_path / "w4a16"
    AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.bfloat16).save_pretrained(folder)
    compress_folder(folder, "w4a16-g32", torch.bfloat16)
    ids = torch.randint(3, 49000, (4, 48), generator=torch.Generator().manual_seed(0))
    held = load_model(folder, LoadSpec(device="cpu"))
    with torch.no_grad():
        got = held(input_ids=ids).logits
    monkeypatch.setattr(int_dequantized, "layerwise_dtype", lambda ckpt, model_class: None)
    whole = load_model(folder, LoadSpec(device="cpu"))  # transformers decompresses it, as before the hold
    with torch.no_grad():
        want = whole(input_ids=ids).logits
    assert holds_codes(held) and not holds_codes(whole)
    assert_same_function(got, want, whole)
    nbytes = [sum(p.numel() * p.element_size() for p in m.parameters()) for m in (held, whole)]
    assert nbytes[0] < 0.55 * nbytes[1]
