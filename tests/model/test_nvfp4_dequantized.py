"""NVFP4 checkpoints load for computation dequantized by surgery (decoded by compressed-tensors), and in
float32 are held in 16 bits (their e2m1 values) and scaled as their layers run: the weights are those of a
float32 copy holding the values compressed-tensors decodes, bit for bit, mixtures of experts included,
and so its logits to float32 summation order (tests.support.models.assert_same_function)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from surgery.core.checkpoint import Checkpoint
from surgery.core.errors import CheckpointError
from surgery.model.loading import LoadSpec, load_model
from tests.support.models import assert_same_function
from tests.support.nvfp4 import build_nvfp4, dense_copy

pytest.importorskip("compressed_tensors")

ARCHS = ["llama", "qwen3_moe"]
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
    from surgery.model.hooks import applied, model_architecture
    from surgery.model.upcast import compute_dtype_of, computed_value
    from tests.support.coverage import proof_edits

    src, copy = _pair(tmp_path, arch)
    held, plain = load_model(src, CPU), load_model(copy, CPU)
    assert holds_codes(held) and compute_dtype_of(held) == torch.float32
    assert {p.dtype for p in held.parameters()} == {torch.bfloat16}
    assert _nbytes(held) == _nbytes(plain) // 2  # nothing decoded whole
    modules = dict(held.named_modules())
    for name, value in plain.named_parameters():
        owner, _, leaf = name.rpartition(".")
        assert torch.equal(computed_value(modules[owner], leaf), value), name
    with torch.no_grad():
        assert_same_function(held(**_batch()).logits, plain(**_batch()).logits, plain)
        edits = [e for group in proof_edits(model_architecture(plain)).values() for e in group]
        with applied(plain, edits):
            want = plain(**_batch()).logits
        with applied(held, edits):
            got = held(**_batch()).logits
    assert_same_function(got, want, plain)


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
