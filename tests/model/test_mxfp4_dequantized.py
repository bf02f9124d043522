"""gpt-oss MXFP4 checkpoints load for computation as their decoded copy: every weight is the value transformers'
decoder gives, bit for bit, and so are the logits (to float32 summation order), with and without run-time
edits. For float32 compute the experts are held as stored (blocks and E8M0 scales) and decoded for each
layer's call by a table of that decoder: the weights, the logits, the run-time edits, find-neurons' capture
and verify's report are those of the bfloat16 hold (transformers' dequantization), bit for bit, at the
file's size."""

from __future__ import annotations

import pytest
import torch

from surgery.core.checkpoint import Checkpoint
from surgery.model.loading import LoadSpec, load_model
from tests.support.held import (
    assert_held_computes_as_dequantized,
    assert_packed_computes_as_sixteen,
    file_bytes,
    held_bytes,
)
from tests.support.mxfp4 import build_mxfp4, dense_copy

pytest.importorskip("compressed_tensors")

CPU = LoadSpec(device="cpu", dtype="float32")


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    return {"input_ids": ids, "attention_mask": mask}


def _sixteen(src, monkeypatch):
    """``src`` loaded as transformers dequantizes it (bfloat16 experts), the hold where it renames tensors."""
    from surgery.formats.mxfp4 import hold

    with monkeypatch.context() as m:
        m.setattr(hold, "load_packed", lambda *args: None)
        return load_model(src, CPU)


@pytest.mark.parametrize("sizes", [{}, {"intermediate_size": 96}], ids=["experts64", "experts96"])
def test_an_mxfp4_checkpoint_computes_as_its_decoded_copy(tmp_path, sizes):
    from surgery.model.dequantized import holds_codes
    from surgery.model.upcast import compute_dtype_of

    src = build_mxfp4(tmp_path / "mx", **sizes)
    copy = dense_copy(src, tmp_path / "dense")
    assert Checkpoint(src).format.loads_dequantized
    held, plain = load_model(src, CPU), load_model(copy, CPU)
    assert holds_codes(held) and compute_dtype_of(held) == torch.float32
    assert {p.dtype for p in held.parameters()} == {torch.bfloat16}  # the release's dtype, widened per layer
    assert_held_computes_as_dequantized(held, plain, _batch())


def test_the_byte_table_decodes_as_transformers_does():
    """The table's pair for every byte at every E8M0 scale, and experts decoded from random bytes at every
    scale but NaN's (2^−127 … 2^127), are transformers' ``convert_moe_packed_tensors``'s, bit for bit."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from surgery.formats.mxfp4 import storage

    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 255, 2, 16), dtype=torch.uint8, generator=gen)
    scales = torch.arange(255, dtype=torch.uint8)[None, :, None].repeat(3, 1, 2)
    scales[1] = torch.randint(0, 255, (255, 2), dtype=torch.uint8, generator=gen)
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    table = storage.pair_values()
    for scale in (0, 1, 126, 127, 128, 254, 255):  # each row of the table is the decoder's pair
        every = torch.arange(256, dtype=torch.uint8).reshape(1, 256, 1, 1)
        one = convert_moe_packed_tensors(every, torch.full((1, 256, 1), scale, dtype=torch.uint8), dtype=torch.float32)
        rows = table[scale * 256 : (scale + 1) * 256]
        assert torch.equal(rows.view(torch.int32), one[0].T.contiguous().view(torch.int32)), scale
    got = storage.decode_held(blocks, scales)
    assert got.shape == want.shape and got.is_contiguous()
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # bits, signed zeros and subnormals included


def test_held_as_stored_it_holds_the_file_and_computes_as_the_16_bit_hold_bit_for_bit(tmp_path, monkeypatch):
    """Each experts parameter is its file's blocks, the model holds at most 1.5× the file, and its weights,
    logits (with and without run-time edits, routed experts' included) and greedy generation are the bfloat16
    hold's, bit for bit."""
    from safetensors import safe_open

    from surgery.formats.mxfp4 import hold

    src = build_mxfp4(tmp_path / "mx", num_local_experts=8, intermediate_size=128)
    packed, sixteen = load_model(src, CPU), _sixteen(src, monkeypatch)
    with safe_open(src / "model.safetensors", "pt") as f:
        for name in hold.weights_of(Checkpoint(src)):
            stored = f.get_tensor(name + "_blocks")
            assert torch.equal(packed.get_parameter(name).detach().view(torch.uint8), stored), name
    print(f"held as stored {held_bytes(packed)} B, in 16 bits {held_bytes(sixteen)} B, file {file_bytes(src)} B")
    assert_packed_computes_as_sixteen(packed, sixteen, src, _batch())
    # eval's answers: greedy generation, its key-value cache and the held weights decoded at every step
    batch = _batch()
    tokens = [m.generate(**batch, max_new_tokens=6, do_sample=False, pad_token_id=0) for m in (packed, sixteen)]
    assert torch.equal(*tokens)


def test_find_neurons_captures_the_experts_as_the_16_bit_hold_does(tmp_path, monkeypatch):
    """find-neurons' expert capture (stopped by an exception after its last layer) on the held blocks: the
    16-bit hold's, bit for bit, and the held parameters are their bytes again after it."""
    from transformers import AutoTokenizer

    from surgery.find.neurons.experts import capture_experts
    from tests.support.neuron_capture import TEXTS
    from tests.support.tokenizer import save_char_tokenizer

    src = save_char_tokenizer(build_mxfp4(tmp_path / "mx"), bos=True)
    tok = AutoTokenizer.from_pretrained(src)
    packed, sixteen = load_model(src, CPU), _sixteen(src, monkeypatch)
    outputs: list[list] = [[], []]
    for model, got in zip((packed, sixteen), outputs):
        capture_experts(model, tok, TEXTS, lambda start, *parts, got=got: got.append(parts), batch_size=4)
    assert len(outputs[0]) == len(outputs[1]) > 0
    for want, got in zip(*outputs):  # an expert no token reached is NaN in both
        for a, b in zip(want, got):
            torch.testing.assert_close(b, a, rtol=0, atol=0, equal_nan=True)
    assert {p.dtype for p in packed.parameters()} == {torch.bfloat16}


def test_verify_of_a_bake_gives_the_16_bit_holds_report(tmp_path, monkeypatch):
    """verify loads the source and the bake held as stored: its report is the bfloat16 hold's."""
    from surgery.bake.bake import bake
    from surgery.bake.check import edited_check
    from surgery.bake.verify import verify
    from surgery.core.edits import NeuronScale, Recipe
    from surgery.formats.mxfp4 import hold

    src = build_mxfp4(tmp_path / "mx")
    recipe = Recipe((NeuronScale(1, 3, 0.0, 1), NeuronScale(0, 5, 0.0, 2)))
    ckpt = Checkpoint(src)
    bake(ckpt, recipe, tmp_path / "out", check=edited_check(ckpt, recipe))
    report = verify(Checkpoint(src), tmp_path / "out", load=CPU)
    monkeypatch.setattr(hold, "load_packed", lambda *args: None)
    sixteen = verify(Checkpoint(src), tmp_path / "out", load=CPU)
    assert report.ok, report.problems
    assert report.to_dict() == sixteen.to_dict()
