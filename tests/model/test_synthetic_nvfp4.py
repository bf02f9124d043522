"""examples/bench_fp4.py's ``quantize`` on a sharded checkpoint (examples/synthetic_checkpoint.py's
Llama-3.1-8B shapes, narrowed): each shard compressed to NVFP4 by compressed-tensors tensor by tensor,
the index naming every stored tensor in its shard, and the result held as stored by surgery's loader."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from safetensors import safe_open

from tests.support.paths import REPO

sys.path.insert(0, str(REPO / "examples"))
from bench_fp4 import quantize  # noqa: E402
from synthetic_checkpoint import build  # noqa: E402

NARROW = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
    max_position_embeddings=256,
)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("syn")
    src = build(root / "llama", "llama-3.1-8b", layers=2, shard_gb=1e-4, sizes=NARROW)
    return src, quantize(src, root / "llama-nvfp4")


def _stored(folder) -> dict[str, dict[str, torch.Tensor]]:
    """shard name → its tensors."""
    out = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            out[shard.name] = {name: f.get_tensor(name) for name in f.keys()}
    return out


def test_each_shard_s_linears_are_compressed_tensors_own_nvfp4(pair):
    from tests.support.nvfp4 import _compress, scheme

    src, out = pair
    before, after = _stored(src), _stored(out)
    assert len(before) > 1 and set(before) == set(after)  # sharded, shard for shard
    linears = 0
    for shard, tensors in before.items():
        for name, value in tensors.items():
            if name.endswith("_proj.weight"):
                linears += 1
                prefix = name.removesuffix("weight")
                for key, want in _compress(value.to(torch.float32), scheme()).items():
                    got = after[shard][prefix + key]
                    assert got.dtype == want.dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8))
                assert name not in after[shard]
            else:  # embeddings, norms, head: the same bf16 bytes
                assert torch.equal(after[shard][name].view(torch.uint8), value.view(torch.uint8)), name
    assert linears == 2 * 7


def test_the_index_names_every_tensor_in_its_shard(pair):
    _, out = pair
    index = json.loads((out / "model.safetensors.index.json").read_text())
    stored = _stored(out)
    assert index["weight_map"] == {name: shard for shard, tensors in stored.items() for name in tensors}
    assert index["metadata"]["total_size"] == sum(t.nbytes for ts in stored.values() for t in ts.values())
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["format"] == "nvfp4-pack-quantized"


def test_it_loads_held_as_stored(pair):
    from surgery.model.loading import LoadSpec, load_model

    _, out = pair
    model = load_model(out, LoadSpec(device="cpu", dtype="float32"))
    packed = model.model.layers[0].mlp.down_proj.weight
    assert packed.dtype == torch.bfloat16 and packed.numel() * 2 == 64 * 128 // 2  # two codes a byte
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[5, 9, 17, 33]])).logits
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
