"""NVFP4 checkpoints load for computation dequantized by surgery (decoded by compressed-tensors), and in
float32 are held as stored (packed codes and scales; in 16 bits, their e2m1 values, where transformers fuses
experts as it loads) and decoded as their layers run: the weights are those of a float32 copy holding the
values compressed-tensors decodes, bit for bit, mixtures of experts included, and so its logits to float32
summation order (tests.support.models.assert_same_function); held as stored, the logits are the 16-bit
hold's bit for bit (the same float32 weights, the same matmul path), at the file's size."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from surgery.core.checkpoint import Checkpoint
from surgery.core.errors import CheckpointError
from surgery.model.loading import LoadSpec, load_model
from tests.support.held import (
    assert_held_computes_as_dequantized,
    assert_packed_computes_as_sixteen,
    file_bytes,
    held_bytes,
)
from tests.support.nvfp4 import build_nvfp4, dense_copy

pytest.importorskip("compressed_tensors")

ARCHS = ["llama", "qwen3_moe"]
PACKED = {"llama"}  # held as stored; transformers fuses qwen3_moe's experts as it loads: held in 16 bits
CPU = LoadSpec(device="cpu", dtype="float32")


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    return {"input_ids": ids, "attention_mask": mask}


def _pair(tmp_path, arch: str):
    src = build_nvfp4(tmp_path / "fp4", arch=arch)
    return src, dense_copy(src, tmp_path / "dense")


def _nbytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("arch", ARCHS)
def test_an_nvfp4_checkpoint_is_held_in_16_bits_and_computes_as_its_decoded_copy(tmp_path, arch):
    from surgery.model.dequantized import holds_codes
    from surgery.model.upcast import compute_dtype_of

    src, copy = _pair(tmp_path, arch)
    held, plain = load_model(src, CPU), load_model(copy, CPU)
    assert holds_codes(held) and compute_dtype_of(held) == torch.float32
    assert {p.dtype for p in held.parameters()} == {torch.bfloat16}
    if arch in PACKED:  # held as stored: the file's bytes
        assert held_bytes(held) <= 1.5 * file_bytes(src)
    else:  # fused experts: e2m1 values in 16 bits, nothing decoded whole
        assert _nbytes(held) == _nbytes(plain) // 2
    assert_held_computes_as_dequantized(held, plain, _batch())


@pytest.mark.parametrize("arch", ARCHS)
def test_where_16_bits_would_round_it_decodes_whole(tmp_path, arch):
    """A float32 tensor bfloat16 cannot hold (a norm): each NVFP4 weight decoded whole, in float32, every
    parameter the decoded copy's bit for bit."""
    from surgery.model.dequantized import holds_codes

    src, copy = _pair(tmp_path, arch)
    for folder in (src, copy):
        tensors = load_file(folder / "model.safetensors")
        tensors["model.norm.weight"] = torch.full_like(tensors["model.norm.weight"], 1 + 1e-4, dtype=torch.float32)
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    model, plain = load_model(src, CPU), load_model(copy, CPU)
    assert not holds_codes(model) and {p.dtype for p in model.parameters()} == {torch.float32}
    got, want = dict(model.named_parameters()), dict(plain.named_parameters())
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert torch.equal(got[name], value), name


def test_a_missing_float_weight_is_one_line(tmp_path):
    src = build_nvfp4(tmp_path / "fp4")
    assert Checkpoint(src).format.loads_dequantized
    tensors = load_file(src / "model.safetensors")
    del tensors["model.layers.1.post_attention_layernorm.weight"]
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="no tensor for 'model.layers.1.post_attention_layernorm.weight'") as e:
        load_model(src, CPU)
    assert "\n" not in str(e.value) and "NVFP4" in str(e.value)


def test_the_byte_table_decodes_as_compressed_tensors_does():
    """Every byte's two e2m1 values are compressed-tensors' unpacking of it, and a weight decoded from its
    bytes and e4m3 scales is compressed-tensors' float32 ``dequantize`` of it, bit for bit."""
    import numpy as np

    from surgery.formats.nvfp4 import storage

    rng = np.random.default_rng(0)
    codes = rng.integers(0, 256, (48, 32), dtype=np.uint8)
    scales = torch.from_numpy(rng.integers(0, 0x7F, (48, 4), dtype=np.uint8)).view(torch.float8_e4m3fn)
    g = torch.tensor([448.0 * 6 / 0.37], dtype=torch.float32)
    s = storage.Scheme(tuple(sorted(storage.ARGS.items())))
    got = storage.decode_held(torch.from_numpy(codes), scales, g)
    want = storage.dequantize(s, storage.unpack(codes), scales.float().numpy(), g.numpy())
    assert torch.equal(storage.byte_values()[torch.from_numpy(codes).long()].reshape(48, 64), storage.unpack(codes))
    assert torch.equal(got, torch.from_numpy(want))


def test_held_as_stored_it_holds_the_file_and_computes_as_the_16_bit_hold_bit_for_bit(tmp_path, monkeypatch):
    """Each weight's parameter is its file's packed bytes, the model holds at most 1.5× the file, and its
    weights and logits (with and without run-time edits) are the 16-bit hold's, bit for bit."""
    from safetensors import safe_open

    from surgery.formats.nvfp4 import hold

    src = build_nvfp4(tmp_path / "fp4", hidden_size=128, intermediate_size=256)
    packed = load_model(src, CPU)
    monkeypatch.setattr(hold, "load_packed", lambda *args: None)  # the hold where transformers renames tensors
    sixteen = load_model(src, CPU)
    with safe_open(src / "model.safetensors", "pt") as f:
        for name in hold.weights_of(Checkpoint(src)):
            stored = f.get_tensor(name + "_packed")
            assert torch.equal(packed.get_parameter(name).detach().view(torch.uint8), stored), name
    print(f"held as stored {held_bytes(packed)} B, in 16 bits {held_bytes(sixteen)} B, file {file_bytes(src)} B")
    assert_packed_computes_as_sixteen(packed, sixteen, src, _batch())
