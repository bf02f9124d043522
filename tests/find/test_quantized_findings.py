"""Finding on quantized models: an FP8 checkpoint or a GGUF file is read directly (dequantized on
load), its findings carry the quantized file's identity, equal those of the same weights in float32,
and apply back onto that file (and, without --transfer, onto no other)."""

from __future__ import annotations

import json

import pytest

import surgery
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.errors import FindingsError
from tests.support.binding import write_small_benchmark
from tests.support.fp8 import build_fp8, dequantized_copy
from tests.support.neuron_pairs import write_pairs
from tests.support.tokenizer import TINY_VOCAB, save_char_tokenizer

# transformers dequantizes the first, surgery the second; the third, stored as releases are (bfloat16 but
# for the e4m3 weights), is held in 16 bits and dequantized a layer at a time (model/dequantized.py)
LAYOUTS = [("block", (8, 8), "float32"), ("block", (24, 24), "float32"), ("block", (8, 8), "bfloat16")]
IDS = ["block8-transformers", "block24-surgery", "block8-bf16-layerwise"]
HEADS_FAST = dict(max_pairs=4, random_sets=1)


def _without_model(found) -> str:
    """A findings file's content but for the model it names (and the vectors file, named after it), as
    JSON text: NaN (a confidence interval of too few pairs) then equals NaN."""
    data = {k: v for k, v in found.data.to_dict().items() if k not in ("model", "vectors")}
    return json.dumps(data, sort_keys=True)


@pytest.fixture
def fp8_pair(tmp_path, request):
    """(FP8 checkpoint, its float32 copy, layout, block), both with the character tokenizer."""
    import torch

    layout, block, rest = request.param
    src = build_fp8(
        tmp_path / "fp8", layout, block, rest=getattr(torch, rest), vocab_size=TINY_VOCAB, max_position_embeddings=512
    )
    save_char_tokenizer(src)
    return src, dequantized_copy(src, tmp_path / "fp32", layout, block)


@pytest.mark.parametrize("fp8_pair", LAYOUTS, ids=IDS, indirect=True)
def test_fp8_findings_are_the_float32_copy_s_and_bake_back_into_the_fp8_checkpoint(fp8_pair, tmp_path):
    src, copy = fp8_pair
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    bench = write_small_benchmark(tmp_path / "bench.jsonl")
    (tmp_path / "a.txt").write_text("the sky is green\nno red is blue\nwhat is this\n")
    (tmp_path / "b.txt").write_text("a quiet day\nmost cats sleep\nrain again\n")
    runs = {
        "neurons": lambda m, out: surgery.find_neurons(m, pairs=pairs, device="cpu", out=out),
        "heads": lambda m, out: surgery.find_heads(m, benchmark=str(bench), device="cpu", out=out, **HEADS_FAST),
        "directions": lambda m, out: surgery.find_direction(
            m, a=tmp_path / "a.txt", b=tmp_path / "b.txt", device="cpu", out=out
        ),
    }
    fingerprint = Checkpoint(src).fingerprint()
    for kind, run in runs.items():
        on_fp8, on_copy = run(src, tmp_path / f"{kind}-fp8.json"), run(copy, tmp_path / f"{kind}-fp32.json")
        assert on_fp8.data.model.fingerprint == fingerprint and on_fp8.data.model.path == str(src), kind
        assert on_copy.data.model.fingerprint != fingerprint
        # the same weights, the same computation: every score is the float32 copy's, bit for bit
        assert _without_model(on_fp8) == _without_model(on_copy), kind
    vectors = [
        json.loads((tmp_path / f"directions-{m}.json").read_text())["vectors"]["sha256"] for m in ("fp8", "fp32")
    ]
    assert vectors[0] == vectors[1]

    baked = surgery.prune_neurons(src, tmp_path / "pruned", n=3, findings=tmp_path / "neurons-fp8.json")
    assert baked.tensors_edited > 0
    record = json.loads((tmp_path / "pruned" / "surgery.json").read_text())
    assert record["verification"]["kind"] == "dequantized weights"
    assert surgery.verify(src, tmp_path / "pruned").ok
    with pytest.raises(FindingsError, match=r"pass transfer=True"):  # the float32 copy is another file
        surgery.prune_neurons(copy, tmp_path / "refused", n=3, findings=tmp_path / "neurons-fp8.json")
    assert not (tmp_path / "refused").exists()


def test_gguf_findings_carry_the_file_s_sha256_and_apply_onto_it_only(tmp_path):
    import torch

    from surgery.bake.gguf_verify import verify_gguf
    from tests.support.tiny_gguf import gguf_source_model, write_tiny_gguf

    src, other = tmp_path / "tiny.gguf", tmp_path / "other.gguf"
    model = gguf_source_model()
    write_tiny_gguf(src, model)
    with torch.no_grad():  # the same architecture, other weights
        model.model.layers[1].mlp.up_proj.weight.mul_(2)
    write_tiny_gguf(other, model)

    found = surgery.find_neurons(src, device="cpu", out=tmp_path / "neurons.json")
    assert found.data.model.fingerprint == file_sha256(src) and found.data.model.path == str(src)
    again = surgery.find_neurons(src, device="cpu")  # the cache is keyed by the file too
    assert again.from_cache and again.data.model == found.data.model

    surgery.prune_neurons(src, tmp_path / "pruned.gguf", n=2, findings=tmp_path / "neurons.json")
    assert verify_gguf(tmp_path / "pruned.gguf", src).ok
    with pytest.raises(FindingsError, match=r"pass transfer=True") as refused:
        surgery.prune_neurons(other, tmp_path / "refused.gguf", n=2, findings=tmp_path / "neurons.json")
    assert f"({src})" in str(refused.value)  # the findings name the GGUF file, not its import in the cache
    assert not (tmp_path / "refused.gguf").exists()
    surgery.prune_neurons(other, tmp_path / "moved.gguf", n=2, findings=tmp_path / "neurons.json", transfer=True)
    assert verify_gguf(tmp_path / "moved.gguf", other).ok


# transformers decompresses the first on a CPU; the others it cannot run, and surgery decodes them as it
# loads (surgery/formats/int_packed/hold.py): asymmetric int4, int8 int-quantized, GPTQ actorder "group", AutoAWQ GEMM
INT_LAYOUTS = ["w4a16-g8", "w4a16-g8-asym", "int8-channel", "w4a16-g8+actorder-group", "awq"]


@pytest.mark.parametrize("layout", INT_LAYOUTS)
def test_int_findings_are_the_decompressed_copy_s_and_bake_back_into_the_int_checkpoint(tmp_path, layout):
    """An integer checkpoint: find-neurons computes on exactly the weights compressed-tensors decodes, and
    its findings prune the integer file."""
    pytest.importorskip("compressed_tensors")
    from tests.support.int_packed import decoded_pair

    pair = decoded_pair(tmp_path, layout, vocab_size=TINY_VOCAB, max_position_embeddings=512)
    src, copy = (save_char_tokenizer(folder) for folder in pair)
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    on_int = surgery.find_neurons(src, pairs=pairs, device="cpu", out=tmp_path / "int.json")
    on_copy = surgery.find_neurons(copy, pairs=pairs, device="cpu", out=tmp_path / "dense.json")
    assert on_int.data.model.fingerprint == Checkpoint(src).fingerprint() and on_int.data.model.path == str(src)
    assert _without_model(on_int) == _without_model(on_copy)  # the same weights, bit for bit

    baked = surgery.prune_neurons(src, tmp_path / "pruned", n=3, findings=tmp_path / "int.json")
    assert baked.tensors_edited > 0
    report = surgery.verify(src, tmp_path / "pruned")
    assert report.ok and "logits" in report.numeric_check
    with pytest.raises(FindingsError, match=r"pass transfer=True"):  # the decompressed copy is another file
        surgery.prune_neurons(copy, tmp_path / "refused", n=3, findings=tmp_path / "int.json")


def test_fp8_moe_neuron_findings_held_layerwise_are_the_float32_copy_s(tmp_path):
    """Routed and shared experts' PPM reads fused expert weights outside a forward: the held e4m3
    values must be dequantized there too (each expert's rows times its own scales)."""
    import torch

    src = build_fp8(
        tmp_path / "fp8",
        "block",
        (16, 16),
        arch="qwen2_moe",
        rest=torch.bfloat16,
        vocab_size=TINY_VOCAB,
        max_position_embeddings=512,
    )
    save_char_tokenizer(src)
    copy = dequantized_copy(src, tmp_path / "fp32", "block", (16, 16))
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    on_fp8 = surgery.find_neurons(src, pairs=pairs, device="cpu", out=tmp_path / "fp8.json")
    on_copy = surgery.find_neurons(copy, pairs=pairs, device="cpu", out=tmp_path / "fp32.json")
    assert _without_model(on_fp8) == _without_model(on_copy)


def test_gguf_findings_with_layers_on_disk_equal_the_in_memory_ones(tmp_path, monkeypatch):
    """A GGUF larger than memory: its import is read a layer at a time from disk by accelerate
    (--device-map auto with a budget below the model), with the findings of the model in memory."""
    import surgery.model.loading as loading
    from surgery.gguf.imported import imported_checkpoint
    from surgery.model.placement import largest_layer_bytes
    from tests.support.tiny_gguf import gguf_source_model, write_tiny_gguf

    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, gguf_source_model())
    in_memory = surgery.find_neurons(src, device="cpu", recompute=True)
    placed = []
    module_map = loading._module_map
    monkeypatch.setattr(loading, "_module_map", lambda *a: placed.append(module_map(*a)) or placed[-1])
    budget = 2 * largest_layer_bytes(imported_checkpoint(src).tensors, 4) + 4096  # the rest goes to disk
    on_disk = surgery.find_neurons(src, device="cpu", device_map="auto", max_memory=f"cpu={budget}B", recompute=True)
    assert "disk" in placed[0].values()
    assert on_disk.data.compute.device_map == "accelerate"
    same = {k: v for k, v in json.loads(_without_model(on_disk)).items() if k != "compute"}
    assert same == {k: v for k, v in json.loads(_without_model(in_memory)).items() if k != "compute"}
