"""Integer checkpoints transformers cannot run (asymmetric int4, int8 int-quantized, GPTQ's actorder
"group", AutoAWQ GEMM) load for computation dequantized by surgery: every parameter equals the one of a
float32 copy holding the values compressed-tensors decodes, bit for bit, mixtures of experts included;
what it cannot fill is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from surgery.core.checkpoint import Checkpoint
from surgery.core.errors import CheckpointError
from surgery.model.int_dequantized import decodes_itself
from surgery.model.loading import LoadSpec, load_model
from tests.support import awq, int_packed

pytest.importorskip("compressed_tensors")

# (layout, arch): a llama for each layout transformers cannot run, and mixtures of experts stored one
# tensor per expert (loaded into transformers' fused 3-D experts)
CASES = [
    ("w4a16-g8-asym", "llama"),
    ("int8-channel", "llama"),
    ("w4a16-g8+actorder-group", "llama"),
    ("awq", "llama"),
    ("w4a16-g8-asym", "qwen2_moe"),
    ("awq", "mixtral"),
]
CPU = LoadSpec(device="cpu", dtype="float32")


@pytest.mark.parametrize(("layout", "arch"), CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_an_integer_checkpoint_transformers_cannot_run_loads_as_its_decoded_copy(tmp_path, layout, arch):
    src, copy = int_packed.decoded_pair(tmp_path, layout, arch=arch)
    assert decodes_itself(Checkpoint(src))
    model, plain = load_model(src, CPU), load_model(copy, CPU)
    got, want = dict(model.named_parameters()), dict(plain.named_parameters())
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert torch.equal(got[name], value), name
    tokens = torch.tensor([[5, 9, 14, 3]])
    assert torch.equal(model(input_ids=tokens).logits, plain(input_ids=tokens).logits)


def test_a_layout_transformers_runs_is_left_to_it(tmp_path):
    src = int_packed.build_int(tmp_path / "int", "w4a16-g8")
    assert not decodes_itself(Checkpoint(src))


def test_a_missing_float_weight_is_one_line_not_a_random_one(tmp_path):
    """Loaded without its quantization, transformers would initialize any weight it finds no tensor for:
    a missing norm (not an integer weight) is refused, naming it."""
    src, _ = int_packed.decoded_pair(tmp_path, "w4a16-g8-asym")
    tensors = load_file(src / "model.safetensors")
    del tensors["model.layers.1.post_attention_layernorm.weight"]
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="no tensor for 'model.layers.1.post_attention_layernorm.weight'") as e:
        load_model(src, CPU)
    assert "\n" not in str(e.value) and "re-download" in str(e.value)


def test_under_disk_offload_an_integer_weight_is_one_line(tmp_path):
    from surgery.model.placement import largest_layer_bytes

    src = awq.build_awq(tmp_path / "int", num_hidden_layers=4)
    budget = f"cpu={2 * largest_layer_bytes(Checkpoint(src).tensors, 4) + 4096}B"  # the rest goes to disk
    spec = LoadSpec(device="cpu", device_map="auto", max_memory=budget, offload_folder=str(tmp_path / "offload"))
    with pytest.raises(CheckpointError, match="offloaded by --device-map") as err:
        load_model(src, spec)
    assert "\n" not in str(err.value) and "AutoAWQ" in str(err.value)


def test_the_config_on_disk_keeps_its_quantization(tmp_path):
    """The load drops quantization_config from the config object it builds, never from the file."""
    src, _ = int_packed.decoded_pair(tmp_path, "awq")
    before = (src / "config.json").read_bytes()
    load_model(src, CPU)
    assert (src / "config.json").read_bytes() == before
    assert json.loads(before)["quantization_config"]["quant_method"] == "awq"
