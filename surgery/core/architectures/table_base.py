"""Llama-shaped decoders, Gemma, Phi-3 and the Mixtral- and Qwen-style mixtures of experts."""

from __future__ import annotations

from .experts import ExpertKeys, Experts, ExpertWeights
from .layout import Attention, Config, Layout, Names, Tail
from .parts import (
    _FUSED_GATE_UP,
    _MIXTRAL_WEIGHTS,
    _N_EXPERTS,
    _N_LOCAL,
    _QWEN_SHARED,
    _QWEN_SPARSE,
    _QWEN_WEIGHTS,
    _WRAPPED,
)
from .records import NativeName

# Mistral's (and Meta's original Llama) native format, as transformers' conversion script renames
# it (models/mistral/convert_mistral_weights_to_hf.py, STATE_DICT_MAPPING; not shipped in the wheel):
# wq/wk are permuted for RoPE by that script, wv/wo and the feed-forward matrices are copied as is.
_META_NATIVE = (
    NativeName(r"tok_embeddings\.weight", "model.embed_tokens.weight"),
    NativeName(r"norm\.weight", "model.norm.weight"),
    NativeName(r"output\.weight", "lm_head.weight"),
    NativeName(r"layers\.(\d+)\.attention_norm\.weight", r"model.layers.\1.input_layernorm.weight"),
    NativeName(r"layers\.(\d+)\.ffn_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
    NativeName(r"layers\.(\d+)\.attention\.w([qk])\.weight", r"model.layers.\1.self_attn.\2_proj.weight", True),
    NativeName(r"layers\.(\d+)\.attention\.w([vo])\.weight", r"model.layers.\1.self_attn.\2_proj.weight"),
    NativeName(r"layers\.(\d+)\.feed_forward\.w1\.weight", r"model.layers.\1.mlp.gate_proj.weight"),
    NativeName(r"layers\.(\d+)\.feed_forward\.w2\.weight", r"model.layers.\1.mlp.down_proj.weight"),
    NativeName(r"layers\.(\d+)\.feed_forward\.w3\.weight", r"model.layers.\1.mlp.up_proj.weight"),
)

BASE: dict[str, Layout] = {
    "llama": Layout(Names(native_names=_META_NATIVE)),
    "mistral": Layout(Names(native_names=_META_NATIVE)),
    "qwen2": Layout(),
    "qwen3": Layout(),
    "gemma": Layout(),
    "gemma2": Layout(tail=Tail(logit_softcap="final_logit_softcapping")),
    "gemma3_text": Layout(tail=Tail(logit_softcap="final_logit_softcapping")),
    # its forward applies no soft-cap (transformers 5.24)
    "gemma3": Layout(Names(_WRAPPED), config=Config(text_config_key="text_config", text_model_types=("gemma3_text",))),
    "phi3": Layout(
        attention=Attention(q_proj=None, k_proj=None, v_proj=None, qkv_proj="self_attn.qkv_proj"), mlp=_FUSED_GATE_UP
    ),
    "olmo2": Layout(),
    "mixtral": Layout(
        experts=Experts(ExpertKeys(("num_local_experts",), "intermediate_size", aliases=_N_LOCAL), _MIXTRAL_WEIGHTS)
    ),
    "qwen2_moe": Layout(
        experts=Experts(
            ExpertKeys(("num_experts", "num_local_experts"), "moe_intermediate_size"),
            _QWEN_WEIGHTS,
            _QWEN_SHARED,
            _QWEN_SPARSE,
        ),
    ),
    "qwen3_moe": Layout(
        experts=Experts(
            ExpertKeys(("num_experts", "num_local_experts"), "moe_intermediate_size"),
            _QWEN_WEIGHTS,
            layers=_QWEN_SPARSE,
        ),
    ),
    "olmoe": Layout(
        experts=Experts(ExpertKeys(("num_experts",), "intermediate_size", aliases=_N_EXPERTS), _QWEN_WEIGHTS)
    ),
    "gpt_oss": Layout(
        experts=Experts(
            ExpertKeys(("num_local_experts",), "intermediate_size", aliases=_N_LOCAL),
            ExpertWeights(None, transposed=True, interleaved=True),
        ),
    ),
}
