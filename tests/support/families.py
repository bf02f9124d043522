"""Tiny random models of the MLA, DeepSeek-V4 and hybrid-layer families, built from their config classes.

One config per model type (no network): hidden 32, 4 heads, 4 layers, vocab 96, with each family's
own keys set small (MLA ranks and head sizes that all differ, so that a head's o_proj width
v_head_dim is not the q·k width; hybrid layer kinds that mix attention and the other kinds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SMALL = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
# MLA: q·k heads of 8 + 4 (nope + rope), v heads of 6, latent ranks 16 (q) and 8 (kv).
MLA = dict(q_lora_rank=16, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, head_dim=4)
# DeepSeek-style MoE configs: a dense first layer, then experts (with a shared expert) in the others.
MOE = dict(
    n_routed_experts=4, moe_intermediate_size=8, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1
)
FIRST_DENSE = dict(first_k_dense_replace=1, **MOE)
MIXED_LIST = dict(mlp_layer_types=["dense", "sparse", "dense", "sparse"], **MOE)
# Hunyuan-V4's experts are not in the table: dense in every layer.
DENSE_LIST = dict(mlp_layer_types=["dense"] * 4, n_routed_experts=4, moe_intermediate_size=8, num_experts_per_tok=2)
HYBRID = ["linear_attention", "full_attention", "linear_attention", "full_attention"]

FAMILIES: dict[str, dict[str, Any]] = {
    "minicpm3": MLA,
    "youtu": MLA,
    "deepseek_v2": {**MLA, **FIRST_DENSE},
    "deepseek_v3": {**MLA, **FIRST_DENSE},
    "sarvam_mla": {**MLA, **FIRST_DENSE},
    "deepseek_v32": {**MLA, **MIXED_LIST, "index_n_heads": 2, "index_head_dim": 8, "index_topk": 4},
    "glm_moe_dsa": {**MLA, **MIXED_LIST, "index_n_heads": 2, "index_head_dim": 8, "index_topk": 4},
    "glm4_moe_lite": {**MLA, **MIXED_LIST},
    "axk1": {**MLA, **MIXED_LIST},
    "axk2": {**MLA, **MIXED_LIST, "index_n_heads": 2, "index_head_dim": 8, "index_topk": 4},
    "hy_v4": {**MLA, **DENSE_LIST, "index_n_heads": 2, "index_head_dim": 8, "index_topk": 4, "hc_mult": 2},
    "qwen3_5_text": dict(
        layer_types=HYBRID,
        head_dim=8,
        num_key_value_heads=2,
        linear_num_value_heads=2,
        linear_num_key_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
    ),
    "olmo_hybrid": dict(layer_types=HYBRID, head_dim=8, num_key_value_heads=2),
    # LFM2 derives its MLP width from intermediate_size: 2·48/3 = 32, × 1.0, rounded up to 16 → 32.
    "lfm2": dict(
        layer_types=["conv", "full_attention", "conv", "full_attention"], num_key_value_heads=2, block_multiple_of=16
    ),
    "lfm3": dict(
        layer_types=["conv", "full_attention", "conv", "sliding_attention"],
        head_dim=8,
        num_key_value_heads=2,
        sliding_window=4,
    ),
    "falcon_h1": dict(
        head_dim=8,
        num_key_value_heads=2,
        mamba_d_ssm=32,
        mamba_n_heads=4,
        mamba_d_head=8,
        mamba_n_groups=1,
        mamba_d_state=8,
        mamba_chunk_size=8,
    ),
    "bamba": dict(
        attn_layer_indices=[1, 3],
        num_key_value_heads=2,
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_n_groups=1,
        mamba_d_state=8,
        mamba_chunk_size=8,
    ),
    # Jamba: attention in layers 1 and 3, experts in layers 0 and 2.
    "jamba": dict(
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=0,
        num_experts=2,
        num_key_value_heads=2,
        mamba_d_state=8,
        mamba_dt_rank=4,
        mamba_expand=2,
    ),
    "nemotron_h": dict(
        layers_block_type=["linear_attention", "full_attention", "mlp", "full_attention"],
        num_key_value_heads=2,
        head_dim=8,
        mamba_num_heads=4,
        mamba_head_dim=16,
        n_groups=1,
        ssm_state_size=8,
        chunk_size=8,
    ),
    "recurrent_gemma": dict(
        block_types=["recurrent", "attention"], num_key_value_heads=1, lru_width=32, attention_window_size=8
    ),
    "kimi_linear": dict(
        **MLA,
        layer_types=HYBRID,
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        linear_attn_config={"head_dim": 8, "num_heads": 4, "short_conv_kernel_size": 4},
        num_experts=4,
        moe_intermediate_size=8,
        num_experts_per_tok=2,
    ),
    "bailing_hybrid": dict(
        **{**MLA, "q_lora_rank": None},
        layer_types=HYBRID,
        mlp_layer_types=["dense", "sparse"] * 2,
        n_group=1,
        topk_group=1,
        num_experts=4,
        moe_intermediate_size=8,
        num_experts_per_tok=2,
    ),
    "qwen3_next": dict(
        layer_types=HYBRID,
        head_dim=8,
        num_key_value_heads=2,
        linear_num_value_heads=2,
        linear_num_key_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=8,
        shared_expert_intermediate_size=12,
    ),
    "deepseek_v4": dict(
        num_key_value_heads=1,
        head_dim=8,
        q_lora_rank=16,
        qk_rope_head_dim=4,
        n_routed_experts=4,
        moe_intermediate_size=8,
        num_experts_per_tok=2,
        hc_mult=2,
        o_groups=2,
        o_lora_rank=6,
        index_n_heads=2,
        index_head_dim=8,
        index_topk=4,
        sliding_window=4,
        layer_types=[
            "sliding_attention",
            "compressed_sparse_attention",
            "heavily_compressed_attention",
            "sliding_attention",
        ],
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
        compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 4},
    ),
}


# Multimodal wrappers: their text model is the text family's, their vision tower a tiny one.
WRAPPERS = {
    "qwen3_5": (
        "qwen3_5_text",
        dict(
            depth=1,
            hidden_size=16,
            intermediate_size=32,
            num_heads=2,
            patch_size=14,
            out_hidden_size=32,
            num_position_embeddings=16,
        ),
    )
}


def family_config(model_type: str, **overrides: Any):
    """The transformers config of ``model_type`` with tiny sizes."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type in WRAPPERS:
        text, vision = WRAPPERS[model_type]
        return CONFIG_MAPPING[model_type](text_config=family_config(text, **overrides).to_dict(), vision_config=vision)
    return CONFIG_MAPPING[model_type](**{**SMALL, **FAMILIES[model_type], **overrides})


def build_family(model_type: str, path: Path, seed: int = 0, **overrides: Any) -> Path:
    """Save a seeded random tiny ``model_type`` model at ``path`` (weights perturbed as build_tiny does)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(model_type, **overrides))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(path)
    return path
