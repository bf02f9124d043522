"""examples/synthetic_checkpoint.py's gpt-oss-20b shapes, narrowed: the tensors transformers' GptOss model
has, its experts in MXFP4 as the release stores them, sharded with an index; it loads in transformers (its
own MXFP4 dequantization) and in surgery's held loader with the same logits, and a routed expert's pruned
neuron with a head × 2 bakes with its check."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from surgery.core.checkpoint import Checkpoint
from tests.support.paths import REPO

sys.path.insert(0, str(REPO / "examples"))
from synthetic_checkpoint import SHAPES, build  # noqa: E402

# the real per-layer structure (heads, experts, blocks of 32), narrowed to seconds on a CPU
NARROW = dict(
    hidden_size=64,
    intermediate_size=64,
    num_local_experts=4,
    num_experts_per_tok=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
    sliding_window=8,
)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return build(tmp_path_factory.mktemp("syn") / "gpt-oss", "gpt-oss-20b", layers=2, shard_gb=1e-4, sizes=NARROW)


def test_the_table_is_gpt_oss_20b_and_the_config_the_release_s(small):
    assert SHAPES["gpt-oss-20b"]["num_local_experts"] == 32 and SHAPES["gpt-oss-20b"]["num_hidden_layers"] == 24
    config = json.loads((small / "config.json").read_text())
    assert config["model_type"] == "gpt_oss" and config["architectures"] == ["GptOssForCausalLM"]
    assert config["layer_types"] == ["sliding_attention", "full_attention"]
    assert config["quantization_config"]["quant_method"] == "mxfp4"
    index = json.loads((small / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # sharded, with an index


def test_the_tensors_are_the_model_s_with_mxfp4_experts(small):
    from transformers import AutoConfig, AutoModelForCausalLM

    tensors = Checkpoint(small).tensors
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(small))
    expected = set()
    for name, p in model.state_dict().items():
        if name.endswith(("gate_up_proj", "down_proj")):  # [experts, in, out] → blocks and E8M0 scales
            experts, inp, out = p.shape
            expected |= {name + "_blocks", name + "_scales"}
            assert tensors[name + "_blocks"].shape == (experts, out, inp // 32, 16)
            assert tensors[name + "_scales"].shape == (experts, out, inp // 32)
            assert tensors[name + "_blocks"].dtype == tensors[name + "_scales"].dtype == "U8"
        else:
            expected.add(name)
            assert tensors[name].shape == tuple(p.shape) and tensors[name].dtype == "BF16", name
    assert set(tensors) == expected
    assert Checkpoint(small).format.name == "mxfp4"


def test_it_loads_in_transformers_and_held_with_the_same_logits(small):
    from transformers import AutoModelForCausalLM, Mxfp4Config

    from surgery.model.dequantized import holds_codes
    from surgery.model.loading import LoadSpec, load_model

    ids = torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    theirs = AutoModelForCausalLM.from_pretrained(
        small, dtype=torch.float32, quantization_config=Mxfp4Config(dequantize=True)
    )
    held = load_model(small, LoadSpec(device="cpu", dtype="float32"))
    assert holds_codes(held)
    with torch.no_grad():
        a, b = theirs(input_ids=ids).logits, held(input_ids=ids).logits
    assert a.isfinite().all() and a.std() > 0
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_a_routed_neuron_and_a_head_bake_with_their_check(small, tmp_path):
    from surgery.api import apply

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "version: 1\nedits:\n"
        "  - {type: neuron, layer: 1, expert: 2, neuron: 17, factor: 0}\n"
        "  - {type: head, layer: 0, head: 1, alpha: 2}\n"
    )
    apply(recipe, small, tmp_path / "out")
    record = json.loads((tmp_path / "out" / "surgery.json").read_text())
    assert record["verification"]["kind"] == "dequantized weights"
