"""Integer checkpoints transformers cannot run (asymmetric int4, int8 int-quantized, GPTQ's actorder
"group", AutoAWQ GEMM) load for computation dequantized by surgery, and in float32 every integer layout
is held (as stored: compressed-tensors' codes; in 16 bits, codes less zero points: AutoAWQ's, or experts
transformers fuses) and decoded as its layers run: the weights are those of a float32 copy holding the
values compressed-tensors decodes, bit for bit, mixtures of experts included, and so its logits to float32
summation order (tests.support.models.assert_same_function); what it cannot fill is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from surgery.core.checkpoint import Checkpoint
from surgery.core.errors import CheckpointError
from surgery.model.loading import LoadSpec, load_model
from tests.support import awq, int_packed
from tests.support.held import (
    assert_held_computes_as_dequantized,
    assert_packed_computes_as_sixteen,
    file_bytes,
    held_bytes,
)
from tests.support.models import assert_same_function

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


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    return {"input_ids": ids, "attention_mask": mask}


def _nbytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


# every layout surgery decodes, and one transformers runs (symmetric W4A16): held too in float32
HELD = [*CASES, ("w4a16-g8", "llama")]


@pytest.mark.parametrize(("layout", "arch"), HELD, ids=[f"{a}-{b}" for a, b in HELD])
def test_an_integer_checkpoint_is_held_in_16_bits_and_computes_as_its_decoded_copy(tmp_path, layout, arch):
    """Its other tensors in one 16-bit dtype (as llm-compressor and AutoAWQ write them), each integer weight
    is held as its codes less their zero points and multiplied by its scales as its layer runs: the weights
    as computed are the decoded copy's, bit for bit, at half its memory; the logits, with and without the
    run-time edits, are the copy's to float32 summation order (its weights are read in place from the file,
    at other memory alignments than the held ones decoded per call: another kernel path on some CPUs)."""
    from surgery.model.dequantized import holds_codes
    from surgery.model.upcast import compute_dtype_of

    src, copy = int_packed.decoded_pair(tmp_path, layout, arch=arch)
    held, plain = load_model(src, CPU), load_model(copy, CPU)
    stored = {p.dtype for p in held.parameters()}
    assert holds_codes(held) and compute_dtype_of(held) == torch.float32
    assert stored in ({torch.bfloat16}, {torch.float16})  # the checkpoint's 16-bit dtype, every parameter
    if arch == "llama" and layout != "awq":  # held as stored (compressed-tensors' codes, tensors by their names)
        assert held_bytes(held) <= 1.5 * file_bytes(src)
    else:  # AutoAWQ's words, or experts transformers fuses: codes less zero points in 16 bits
        assert _nbytes(held) == _nbytes(plain) // 2  # nothing decoded whole
    assert_held_computes_as_dequantized(held, plain, _batch())
    assert {p.dtype for p in held.parameters()} == stored


def test_the_logits_are_compared_to_float32_summation_order_and_no_further(tmp_path):
    """The case issue 33 reported (asymmetric W4A16 Qwen2-MoE on an AVX-512 CPU): the held model's logits
    one float32 ulp off the decoded copy's pass; a single weight decoded to another code of its group
    (a real decoding error) does not."""
    src, copy = int_packed.decoded_pair(tmp_path, "w4a16-g8-asym", arch="qwen2_moe")
    held, plain = load_model(src, CPU), load_model(copy, CPU)
    with torch.no_grad():
        want = plain(**_batch()).logits
        assert_same_function(held(**_batch()).logits, want, plain)
        assert_same_function(torch.nextafter(want, torch.full_like(want, torch.inf)), want, plain)  # one ulp
        weight = plain.model.layers[0].self_attn.o_proj.weight
        group = weight[0, :8]  # one quantization group: its values are codes times one scale
        other = int(torch.nonzero(group != group[0])[0, 0])
        weight[0, 0] = group[other]
        wrong = plain(**_batch()).logits
    with pytest.raises(AssertionError):
        assert_same_function(wrong, want, plain)


@pytest.mark.parametrize(("layout", "arch"), CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_an_integer_checkpoint_transformers_cannot_run_decodes_whole_where_16_bits_would_round(tmp_path, layout, arch):
    """A float32 tensor bfloat16 cannot hold (a norm): the load is in float32, each integer weight decoded
    whole, every parameter the decoded copy's bit for bit (the logits: to float32 summation order)."""
    from surgery.model.dequantized import holds_codes

    src, copy = int_packed.decoded_pair(tmp_path, layout, arch=arch)
    assert Checkpoint(src).format.loads_dequantized
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
    with torch.no_grad():
        assert_same_function(model(**_batch()).logits, plain(**_batch()).logits, plain)


def test_a_bfloat16_compute_or_a_device_map_does_not_hold(tmp_path):
    from surgery.model.dequantized import holds_codes

    src, _ = int_packed.decoded_pair(tmp_path, "w4a16-g8-asym")
    assert not holds_codes(load_model(src, LoadSpec(device="cpu", dtype="bfloat16")))
    assert not holds_codes(load_model(src, LoadSpec(device="cpu", dtype="float32", device_map="auto")))


def test_a_layout_transformers_runs_is_left_to_it(tmp_path):
    src = int_packed.build_int(tmp_path / "int", "w4a16-g8")
    assert not Checkpoint(src).format.loads_dequantized


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


PACKED = ["w4a16-g8", "w4a16-g8-asym", "int8-channel", "w4a16-g8+actorder-group", "w4a16-tensor", "w8a16-channel"]


@pytest.mark.parametrize("bits", [4, 8])
def test_the_byte_table_unpacks_as_compressed_tensors_does(bits):
    """Each byte of packed words looked up in the table gives compressed-tensors' unpacking of the words."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    from surgery.formats.int_packed.storage import byte_codes

    words = torch.randint(-(2**31), 2**31 - 1, (40, 12), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    looked_up = torch.nn.functional.embedding(words.view(torch.uint8).to(torch.int32), byte_codes(bits))
    want = unpack_from_int32(words, bits, torch.Size([40, 12 * 32 // bits]))
    assert torch.equal(looked_up.reshape(40, -1), want.to(torch.float32))


@pytest.mark.parametrize("layout", PACKED)
def test_held_as_stored_it_holds_the_file_and_computes_as_the_16_bit_hold_bit_for_bit(tmp_path, monkeypatch, layout):
    """Each weight's parameter is its file's codes (I32 words or I8), the model holds at most 1.5× the file,
    and its weights and logits (with and without run-time edits) are the 16-bit hold's, bit for bit."""
    from safetensors import safe_open

    from surgery.formats.int_packed import hold

    scheme, _, actorder = layout.partition("+actorder-")
    src = int_packed.build_int(tmp_path / "int", scheme, actorder=actorder or None)
    packed = load_model(src, CPU)
    monkeypatch.setattr(hold, "load_packed", lambda *args: None)  # the hold where transformers renames tensors
    sixteen = load_model(src, CPU)
    ckpt = Checkpoint(src)
    with safe_open(src / "model.safetensors", "pt") as f:
        for name, w in hold.weights_of(ckpt).items():
            stored = f.get_tensor(w.codes.name)
            assert torch.equal(packed.get_parameter(name).detach().view(stored.dtype), stored), name
    assert_packed_computes_as_sixteen(packed, sixteen, src, _batch())


@pytest.mark.parametrize("layout", ["w4a16-g8", "w4a16-g8-asym", "int8-channel"])
def test_a_float32_integer_checkpoint_holds_its_codes_as_stored_and_computes_as_its_decoded_copy(tmp_path, layout):
    """Its other tensors float32 (a float32 import compressed): there is no 16-bit dtype to hold codes less
    zero points in, but the codes as stored need none: the model holds at most 1.5× the file, its weights as
    computed are the decoded copy's bit for bit, and its logits, with and without run-time edits, the copy's
    to float32 summation order."""
    from surgery.model.dequantized import holds_codes

    src, copy = int_packed.decoded_pair(tmp_path, layout, dtype=torch.float32)
    held, plain = load_model(src, CPU), load_model(copy, CPU)
    assert holds_codes(held) and held_bytes(held) <= 1.5 * file_bytes(src)
    assert_held_computes_as_dequantized(held, plain, _batch())
