"""A tiny Llama written as a llama.cpp GGUF (F32 + one Q8_0 tensor, sentencepiece vocabulary in the metadata)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, FFN, LAYERS = 4, 2, 16, 64, 96, 2
# A sentencepiece vocabulary: specials, the word-start marker, letters, a few merged pieces.
TOKENS = (
    ["<unk>", "<s>", "</s>", "\u2581"]
    + list("abcdefghijklmnopqrstuvwxyz")
    + ["\u2581t", "he", "\u2581the", "\u2581c", "at", "\u2581cat"]
)
SCORES = [0.0, 0.0, 0.0, -1.0] + [-2.0 - i / 100 for i in range(26)] + [-0.5, -0.6, -0.1, -0.7, -0.8, -0.2]
TYPES = [2, 3, 3] + [1] * (len(TOKENS) - 3)  # unknown, control, control, normal…
QUANTIZED = "model.layers.0.mlp.down_proj.weight"  # stored as Q8_0: exercises dequantization
GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (rotary halves interleaved); transformers undoes it on load."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(hf: str) -> str:
    """The llama.cpp name of the transformers tensor ``hf``."""
    if hf in TOP_NAMES:
        return TOP_NAMES[hf]
    parts = hf.split(".")
    return f"blk.{parts[2]}.{GGUF_NAMES['.'.join(parts[3:-1])]}.weight"


def gguf_source_model():
    """The seeded tiny Llama the test GGUFs are written from (fp32, eval mode)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=len(TOKENS),
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms start at exactly 1: perturb so every tensor matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def write_tiny_gguf(path: Path, model, arch: str = "llama", strings: dict[str, str] | None = None) -> None:
    """Write ``model`` as a llama.cpp-style GGUF (``QUANTIZED`` in Q8_0, the rest F32), with the metadata
    ``strings`` (key: value) too."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny test llama")
    for key, value in (strings or {}).items():
        w.add_string(key, value)
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
