"""FP8 checkpoints load for computation dequantized, on a CPU: every parameter equals the one of a
plain float32 copy holding the same values (e4m3 × scale), bit for bit — through transformers'
dequantization where its blocks are whole, through surgery's own where they are not."""

from __future__ import annotations

import pytest
import torch

from surgery.core.checkpoint import Checkpoint
from surgery.model.dequantized import whole_blocks
from surgery.model.loading import LoadSpec, load_model
from tests.support.fp8 import build_fp8, dequantized_copy

# (layout, block, transformers dequantizes it exactly); the tiny Llama's weights are 32 and 48 wide
LAYOUTS = [
    ("block", (8, 8), True),
    ("block", (128, 128), True),  # one block per weight
    ("block", (24, 24), False),  # partial blocks: 32 = 24 + 8
    ("per-tensor", (8, 8), True),
    ("per-channel", (8, 8), True),
]
IDS = ["block8", "block128-one", "block24-partial", "per-tensor", "per-channel"]


@pytest.mark.parametrize(("layout", "block", "whole"), LAYOUTS, ids=IDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_fp8_checkpoint_loads_as_its_dequantized_copy(tmp_path, layout, block, whole, dtype):
    src = build_fp8(tmp_path / "fp8", layout, block)
    copy = dequantized_copy(src, tmp_path / "fp32", layout, block)
    assert whole_blocks(Checkpoint(src)) is whole
    fp8_model, plain = load_model(src, _spec(dtype)), load_model(copy, _spec(dtype))
    got, want = dict(fp8_model.named_parameters()), dict(plain.named_parameters())
    assert sorted(got) == sorted(want)
    assert str(fp8_model.dtype) == f"torch.{dtype}"
    for name, value in want.items():
        assert torch.equal(got[name], value), name
    assert type(fp8_model.model.layers[0].mlp.down_proj) is torch.nn.Linear  # nothing left quantized


def _spec(dtype: str) -> LoadSpec:
    return LoadSpec(device="cpu", dtype=dtype)


@pytest.mark.parametrize(("block", "whole"), [((8, 8), True), ((24, 24), False)], ids=["block8", "block24-partial"])
def test_under_disk_offload_whole_blocks_load_and_partial_ones_are_one_line(tmp_path, block, whole):
    from surgery.core.errors import CheckpointError
    from surgery.model.placement import largest_layer_bytes

    src = build_fp8(tmp_path / "fp8", "block", block, num_hidden_layers=4)
    budget = f"cpu={2 * largest_layer_bytes(Checkpoint(src).tensors, 4) + 4096}B"  # the rest goes to disk
    spec = LoadSpec(device="cpu", device_map="auto", max_memory=budget, offload_folder=str(tmp_path / "offload"))
    if not whole:
        with pytest.raises(CheckpointError, match="offloaded by --device-map") as err:
            load_model(src, spec)
        assert "\n" not in str(err.value)
        return
    net = load_model(src, spec)
    assert "disk" in net.hf_device_map.values()
    plain = load_model(dequantized_copy(src, tmp_path / "fp32", "block", block), _spec("float32"))
    tokens = torch.tensor([[5, 9, 14, 3]])
    assert torch.equal(net(input_ids=tokens).logits, plain(input_ids=tokens).logits)


@pytest.mark.parametrize(("block", "whole"), [((8, 8), True), ((16, 16), False)], ids=["block8", "block16-partial"])
def test_an_fp8_mixture_of_experts_loads_as_its_dequantized_copy(tmp_path, block, whole):
    """One tensor per expert on disk, fused experts in memory: a partial-block expert (the shared expert's
    24 rows in blocks of 16, the 16-wide experts' down columns) is dequantized by surgery into its rows
    of the layer's fused 3-D parameters."""
    src = build_fp8(tmp_path / "fp8", "block", block, arch="qwen2_moe")
    copy = dequantized_copy(src, tmp_path / "fp32", "block", block)
    assert whole_blocks(Checkpoint(src)) is whole
    fp8_model, plain = load_model(src, _spec("float32")), load_model(copy, _spec("float32"))
    got, want = dict(fp8_model.named_parameters()), dict(plain.named_parameters())
    assert sorted(got) == sorted(want) and "model.layers.1.mlp.experts.gate_up_proj" in got
    for name, value in want.items():
        assert torch.equal(got[name], value), name
    tokens = torch.tensor([[5, 9, 14, 3]])
    assert torch.equal(fp8_model(input_ids=tokens).logits, plain(input_ids=tokens).logits)
