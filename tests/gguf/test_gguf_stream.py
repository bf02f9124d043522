"""import-gguf streams: one block of tensors dequantized at a time into safetensors shards, and the
result is what transformers' from_pretrained + save_pretrained writes, tensor for tensor (names,
dtypes, shapes, bytes) with the same config, generation config and tokenizer files."""

from __future__ import annotations

import json

import pytest

from surgery.core.errors import CheckpointError
from surgery.gguf.header import read_gguf_header
from surgery.gguf.import_stream import INDEX, meta_model, whole_model_reason
from surgery.gguf.importing import import_gguf
from tests.support.gguf_reference import differences, raw_tensors, reference_import, weight_files
from tests.support.moe_gguf import write_moe_gguf
from tests.support.paths import real_model_path
from tests.support.tiny_gguf import gguf_source_model, write_tiny_gguf
from tests.support.typed_gguf import write_typed_gguf

SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
BUILDERS = {
    "llama F32+Q8_0": lambda p: write_tiny_gguf(p, gguf_source_model()),
    "llama Q4_K": lambda p: write_typed_gguf(p, "Q4_K"),
    "llama Q4_1": lambda p: write_typed_gguf(p, "Q4_1"),
    "llama F16": lambda p: write_typed_gguf(p, "F16"),
    "llama BF16": lambda p: write_typed_gguf(p, "BF16"),
    "qwen2moe Q8_0": lambda p: write_moe_gguf(p, "Q8_0"),  # fused gate/up experts, split back on save
    "qwen2moe Q4_K": lambda p: write_moe_gguf(p, "Q4_K"),
}


def _reference(src, tmp_path, dtype):
    """transformers' import, with the one change import-gguf makes to it (no quantization_config)."""
    from surgery.gguf.importing import _strip_quantization

    ref = reference_import(src, tmp_path / "reference", dtype)
    _strip_quantization(ref / "config.json")
    return ref


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", list(BUILDERS))
def test_streamed_import_equals_transformers_import(case, dtype, tmp_path):
    src = tmp_path / "src.gguf"
    BUILDERS[case](src)
    ours = import_gguf(src, tmp_path / "ours", dtype=dtype).path
    assert differences(ours, _reference(src, tmp_path, dtype), SIDE_FILES) == []
    assert not (ours / INDEX).exists()  # small: one file, as save_pretrained writes it


def test_shards_are_bounded_and_indexed(tmp_path):
    """With a shard size below the model, the weights span several 0644 files named and indexed
    as save_pretrained names them, each within the limit unless one tensor alone exceeds it, and
    transformers loads them as the single-file import."""
    from transformers import AutoModelForCausalLM

    src = tmp_path / "src.gguf"
    write_moe_gguf(src, "Q8_0")
    single = import_gguf(src, tmp_path / "single").path
    limit = 2_000_000
    ours = import_gguf(src, tmp_path / "sharded", shard_bytes=limit).path
    files = weight_files(ours)
    assert len(files) > 2 and [f.name for f in files][0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert not (ours / "model.safetensors").exists()
    tensors = raw_tensors(ours)
    assert tensors == raw_tensors(single)
    index = json.loads((ours / INDEX).read_text())
    assert index["metadata"]["total_size"] == sum(len(raw) for _, _, raw in tensors.values())
    assert set(index["weight_map"]) == set(tensors)
    for f in files:
        assert oct(f.stat().st_mode & 0o777) == oct(0o644)
        sizes = [len(tensors[n][2]) for n, file in index["weight_map"].items() if file == f.name]
        assert sum(sizes) <= limit or len(sizes) == 1
    manifest = json.loads((ours / "surgery.gguf.json").read_text())
    assert {f.name for f in files} | {INDEX} <= set(manifest["files"])
    model, info = AutoModelForCausalLM.from_pretrained(ours, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


@pytest.mark.parametrize("kind", ["Q4_K", "Q8_0", "F16", "BF16", "F32"])
def test_dequantized_in_slabs_equals_gguf_py_on_the_reader_data(kind, tmp_path, monkeypatch):
    """Each tensor dequantized a few rows at a time from surgery's header equals gguf-py's dequantize of
    the data GGUFReader gives (bit for bit, same shape): one row per call, and the whole tensor in one."""
    import numpy as np
    from gguf import GGUFReader, dequantize

    from surgery.gguf import import_stream as gguf_stream

    src = tmp_path / "src.gguf"
    write_typed_gguf(src, kind)
    header = read_gguf_header(src)
    for slab in (1, 1 << 30):  # bytes per call: one row at a time, or every row at once
        monkeypatch.setattr(gguf_stream, "DEQUANTIZE_BYTES", slab)
        for t in GGUFReader(str(src)).tensors:
            with open(src, "rb") as f:
                ours = gguf_stream.dequantized(f.fileno(), header.tensors[t.name])
            theirs = dequantize(t.data, t.tensor_type)
            assert ours.dtype == np.float32 and ours.shape == theirs.shape
            assert np.array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32)), t.name


def test_progress_advances_per_tensor(tmp_path):
    src = tmp_path / "src.gguf"
    write_moe_gguf(src, "Q8_0")
    seen = []
    import_gguf(src, tmp_path / "out", progress=lambda stage, done, total: seen.append((stage, done, total)))
    steps = [(done, total) for stage, done, total in seen if stage == "dequantize"]
    n = len(read_gguf_header(src).tensors)
    assert steps == [(i, n) for i in range(n + 1)]


def test_whole_model_path_is_chosen_from_data(tmp_path):
    """Architectures transformers loads through its conversion pipeline (integrations/gguf) keep
    the whole-model import; the ones its TENSOR_PROCESSORS load stream."""
    from transformers import AutoConfig
    from transformers.integrations.gguf import GGUF_ARCHS

    src = tmp_path / "src.gguf"
    write_tiny_gguf(src, gguf_source_model())
    model = meta_model(AutoConfig.from_pretrained(tmp_path, gguf_file=src.name), "float32")
    assert whole_model_reason("llama", model) is None
    for arch in GGUF_ARCHS:
        assert "conversion pipeline" in whole_model_reason(arch, model)


def test_a_gguf_missing_weights_is_refused_in_one_line(tmp_path):
    """A llama-shaped file labelled gemma3 lacks gemma3's q/k and extra norms: transformers would fill
    them with initial values; the import refuses and writes nothing."""
    src = tmp_path / "src.gguf"
    write_typed_gguf(src, "Q8_0", arch="gemma3")
    with pytest.raises(CheckpointError, match=r"holds no tensor for 8 weights of the Gemma3ForCausalLM") as info:
        import_gguf(src, tmp_path / "out")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_truncated_tensor_data_is_one_line(tmp_path):
    src = tmp_path / "src.gguf"
    write_typed_gguf(src, "Q4_K")
    with open(src, "r+b") as f:
        f.truncate(src.stat().st_size - 1000)
    with pytest.raises(CheckpointError, match=r"src\.gguf is truncated: tensor .* download it again") as info:
        import_gguf(src, tmp_path / "out")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow(minutes=6)
@pytest.mark.parametrize("name", ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"])
def test_real_streamed_import_equals_transformers_import(name, tmp_path):
    src = real_model_path(".gguf") / name
    if not src.is_file():
        pytest.skip(f"{name} not at {src}; run `python examples/get_models.py` first")
    ours = import_gguf(src, tmp_path / "ours").path
    assert differences(ours, _reference(src, tmp_path, "float32"), SIDE_FILES) == []
