"""FP8 checkpoints load for computation dequantized, on a CPU: every weight (a held one's as its layer
computes with it) equals the one of a plain float32 copy holding the same values (e4m3 × scale), bit for
bit — through transformers' dequantization where its blocks are whole, through surgery's own where they
are not or where the e4m3 bytes are held; and so the logits, to float32 summation order
(tests.support.models.assert_same_function)."""

from __future__ import annotations

import pytest
import torch

from surgery.core.checkpoint import Checkpoint
from surgery.formats.fp8.hold import whole_blocks
from surgery.model.dequantized import holds_codes
from surgery.model.loading import LoadSpec, load_model
from surgery.model.upcast import computed_value
from tests.support.fp8 import build_fp8, dequantized_copy
from tests.support.models import assert_same_function

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
    # In float32 the e4m3 bytes are held (a float32 rest, loaded by name): the weights are what each layer
    # computes with; in bfloat16 the model is dequantized whole.
    assert holds_codes(fp8_model) is (dtype == "float32")
    for name, value in want.items():
        owner, _, leaf = name.rpartition(".")
        assert torch.equal(computed_value(fp8_model.get_submodule(owner), leaf).to(value.dtype), value), name
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
    assert_same_function(net(input_ids=tokens).logits, plain(input_ids=tokens).logits, plain)


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
    assert_same_function(fp8_model(input_ids=tokens).logits, plain(input_ids=tokens).logits, plain)


# FP8 releases store everything else in bfloat16 (DeepSeek-V3: its router bias in float32, which
# transformers keeps float32): the e4m3 values are held in 16 bits and dequantized a layer at a time.
HELD = [
    ("llama", "block", (8, 8)),
    ("llama", "block", (24, 24)),  # partial blocks: surgery's own arithmetic either way
    ("llama", "per-tensor", (8, 8)),
    ("llama", "per-channel", (8, 8)),
    ("qwen2_moe", "block", (16, 16)),  # one tensor per expert, fused in memory
    ("deepseek_v3", "block", (16, 16)),
]
HELD_IDS = ["llama-block8", "llama-block24-partial", "llama-per-tensor", "llama-per-channel", "qwen2moe", "dsv3"]


def _batch(vocab: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, vocab, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize(("arch", "layout", "block"), HELD, ids=HELD_IDS)
def test_a_bf16_fp8_release_is_held_in_16_bits_and_computes_as_its_dequantized_copy(tmp_path, arch, layout, block):
    from surgery.core.architectures import text_config
    from surgery.model.dequantized import holds_codes
    from surgery.model.hooks import applied, model_architecture
    from surgery.model.upcast import compute_dtype_of
    from tests.support.coverage import proof_edits

    src = build_fp8(tmp_path / "fp8", layout, block, arch=arch, rest=torch.bfloat16)
    copy = dequantized_copy(src, tmp_path / "fp32", layout, block)
    held, plain = load_model(src, _spec("float32")), load_model(copy, _spec("float32"))
    assert holds_codes(held) and not holds_codes(plain) and compute_dtype_of(held) == torch.float32
    kept32 = tuple(type(held)._keep_in_fp32_modules_strict or ())  # DeepSeek-V3's router, as transformers keeps it
    stored = {p.dtype for n, p in held.named_parameters() if not any(k in n for k in kept32)}
    assert stored == {torch.bfloat16}  # the e4m3 values, exact in bf16; nothing dequantized whole
    bytes_held = sum(p.numel() * p.element_size() for p in held.parameters())
    assert bytes_held < 0.6 * sum(p.numel() * p.element_size() for p in plain.parameters())
    batch = _batch(int(text_config(Checkpoint(src).config)["vocab_size"]))
    with torch.no_grad():
        assert_same_function(held(**batch).logits, plain(**batch).logits, plain)
        edits = [e for group in proof_edits(model_architecture(plain)).values() for e in group]
        with applied(plain, edits):
            want = plain(**batch).logits
        with applied(held, edits):
            got = held(**batch).logits
    assert_same_function(got, want, plain)  # the run-time twins see the dequantized weights
    assert {p.dtype for n, p in held.named_parameters() if not any(k in n for k in kept32)} == stored


def test_fp8_is_dequantized_whole_where_holding_it_in_16_bits_would_round_or_is_not_asked(tmp_path):
    """A float32 tensor transformers does not keep float32 would be rounded by a 16-bit load; a
    bfloat16 compute dtype, or a device map, use transformers' dequantization as before."""
    from safetensors.torch import load_file, save_file

    from surgery.model.dequantized import holds_codes

    src = build_fp8(tmp_path / "fp8", "block", (8, 8), rest=torch.bfloat16)
    assert not holds_codes(load_model(src, _spec("bfloat16")))
    tensors = load_file(src / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].float() + 1e-4  # not bf16-representable
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    whole = load_model(src, _spec("float32"))
    assert not holds_codes(whole) and {p.dtype for p in whole.parameters()} == {torch.float32}
    assert torch.equal(whole.model.norm.weight, tensors["model.norm.weight"])


# A float32 rest (an FP8 checkpoint made from a float32 import): only the e4m3 bytes can be held.
BYTES = [("block", (8, 8)), ("block", (24, 24)), ("per-tensor", (8, 8)), ("per-channel", (8, 8))]


@pytest.mark.parametrize(("layout", "block"), BYTES, ids=["block8", "block24-partial", "per-tensor", "per-channel"])
def test_a_float32_fp8_checkpoint_holds_its_e4m3_bytes_and_computes_as_the_whole_dequantization(
    tmp_path, monkeypatch, layout, block
):
    """Its other tensors float32: each e4m3 weight's parameter is its file's bytes (one a weight), the model
    holds at most 1.5× the file, and every weight and the logits, with and without run-time edits, are the
    model dequantized whole's, bit for bit."""
    from safetensors import safe_open

    from surgery.formats.fp8 import Fp8
    from tests.support.held import assert_packed_computes_as_sixteen

    src = build_fp8(tmp_path / "fp8", layout, block)  # every other tensor float32
    held = load_model(src, _spec("float32"))
    monkeypatch.setattr(Fp8, "layerwise_dtype", lambda self, ckpt, config: None)  # dequantized whole
    whole = load_model(src, _spec("float32"))
    assert holds_codes(held) and not holds_codes(whole)
    with safe_open(src / "model.safetensors", "pt") as f:
        for name in f.keys():
            stored = f.get_tensor(name)
            if stored.dtype == torch.float8_e4m3fn:
                assert torch.equal(held.get_parameter(name).detach().view(torch.uint8), stored.view(torch.uint8))
    assert_packed_computes_as_sixteen(held, whole, src, _batch(int(Checkpoint(src).config["vocab_size"])))


def test_fp8_bytes_whose_rows_are_an_odd_number_of_bytes_are_dequantized_whole(tmp_path):
    """A 16-bit view needs an even number of bytes a row: down_proj 33 wide is not held, and with a float32
    rest the model is then dequantized whole (float32 compute cannot hold e4m3 values in a float32 load)."""
    src = build_fp8(tmp_path / "fp8", "per-tensor", (8, 8), intermediate_size=33)
    model = load_model(src, _spec("float32"))
    assert not holds_codes(model) and {p.dtype for p in model.parameters()} == {torch.float32}
