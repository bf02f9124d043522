"""gpt-oss MXFP4 checkpoints load for computation dequantized by transformers: every parameter is that of a
copy holding the values transformers' decoder gives, bit for bit (held in bfloat16 for float32 compute:
e2m1 times a power of two is exact there), and so are the logits, with and without run-time edits."""

from __future__ import annotations

import pytest
import torch

from surgery.core.checkpoint import Checkpoint
from surgery.model.loading import LoadSpec, load_model
from tests.support.models import assert_same_function
from tests.support.mxfp4 import build_mxfp4, dense_copy

pytest.importorskip("compressed_tensors")

CPU = LoadSpec(device="cpu", dtype="float32")


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("sizes", [{}, {"intermediate_size": 96}], ids=["experts64", "experts96"])
def test_an_mxfp4_checkpoint_computes_as_its_decoded_copy(tmp_path, sizes):
    from surgery.model.hooks import applied, model_architecture
    from surgery.model.upcast import compute_dtype_of
    from tests.support.coverage import proof_edits

    src = build_mxfp4(tmp_path / "mx", **sizes)
    copy = dense_copy(src, tmp_path / "dense")
    assert Checkpoint(src).format.loads_dequantized
    held, plain = load_model(src, CPU), load_model(copy, CPU)
    assert compute_dtype_of(held) == torch.float32
    assert {p.dtype for p in held.parameters()} == {torch.bfloat16}  # the release's dtype, widened per layer
    got = dict(held.named_parameters())
    for name, value in plain.named_parameters():
        assert torch.equal(got[name].float(), value), name
    with torch.no_grad():
        assert_same_function(held(**_batch()).logits, plain(**_batch()).logits, plain)
        edits = [e for group in proof_edits(model_architecture(plain)).values() for e in group]
        with applied(plain, edits):
            want = plain(**_batch()).logits
        with applied(held, edits):
            got_logits = held(**_batch()).logits
    assert_same_function(got_logits, want, plain)
