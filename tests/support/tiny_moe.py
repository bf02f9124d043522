"""Tiny configs of the mixture-of-experts families of issue 24, built from their config classes.

One recipe for every family: the common sizes below, set through whichever of these keys the
family's config class has (4 experts, top-2, experts 16 wide, 2 shared experts, the first layer
dense where the family can have dense layers), then the few per-family keys in ``OVERRIDES``.
"""

from __future__ import annotations

import dataclasses
import inspect

SIZES = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
EXPERTS = dict(
    num_experts_per_tok=2,
    moe_k=2,
    moe_topk=2,
    moe_intermediate_size=16,
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    moe_num_experts=4,
    shared_expert_intermediate_size=24,
    shared_intermediate_size=24,
    n_shared_experts=2,
    num_shared_experts=2,
    moe_num_shared_experts=2,
    first_k_dense_replace=1,
    num_dense_layers=1,
    moe_layer_start_index=1,
    n_group=1,
    topk_group=1,
)
# Multi-head latent attention (DeepSeek): q·k heads of 8 + 4 (rope), value heads of 8, a k/v head per head.
MLA = dict(q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, num_key_value_heads=4)
HYBRID = ["linear_attention", "full_attention", "linear_attention"]
OVERRIDES: dict[str, dict] = {
    "deepseek_v2": MLA,
    "deepseek_v3": MLA,
    "sarvam_mla": MLA,
    "glm4_moe_lite": MLA,
    "axk1": MLA,
    "axk2": dict(MLA, index_n_heads=2, index_head_dim=8, index_topk=4),
    "deepseek_v32": dict(MLA, index_n_heads=2, index_head_dim=8, index_topk=4),
    "glm_moe_dsa": dict(MLA, index_n_heads=2, index_head_dim=8, index_topk=4),
    "cohere2_moe": dict(mlp_layer_types=["dense", "sparse", "sparse"], prefix_dense_intermediate_size=40),
    "mellum": dict(mlp_layer_types=["dense", "sparse", "sparse"]),
    "beam": dict(mlp_layer_types=["dense", "sparse", "sparse"]),
    "minimax_m3_vl_text": dict(mlp_layer_types=["dense", "sparse", "sparse"], dense_intermediate_size=40),
    "zaya": dict(num_experts_per_tok=1),  # ZAYA routes each token to one expert (or none)
    "llama4_text": dict(interleave_moe_layer_step=2, intermediate_size_mlp=40),  # dense, sparse, dense
    # hybrids: each kind of layer once
    "lfm2_moe": dict(layer_types=["conv", "full_attention", "conv"], num_dense_layers=1),
    "granitemoehybrid": dict(
        layer_types=["mamba", "attention", "mamba"],
        mamba_n_heads=8,
        mamba_d_head=8,
        mamba_d_state=8,
        mamba_chunk_size=8,
    ),
    "qwen3_next": dict(layer_types=HYBRID),
    "qwen3_5_moe_text": dict(layer_types=HYBRID),
    "qwen4_exp_text": dict(
        layer_types=HYBRID,
        hc_lowrank=8,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        indexer_n_heads=2,
        indexer_kv_heads=1,
        indexer_head_dim=8,
        indexer_budget=8,
        indexer_compress_ratio=2,
        ple_layer_ids=[],
        ple_embed_dim=8,
        ngram_vocab_size_base=64,
        split_ngram_parts=2,
    ),
    "bailing_hybrid": dict(layer_types=HYBRID, **MLA),
    # LongCat-Flash: two sub-layers per decoder layer (num_hidden_layers = 2 × num_layers), its rotary part
    # head_dim = qk_rope_head_dim, and two zero-computation experts beside the four routed ones. Described by
    # tests/core/test_moe_table.py; proven by the coverage sweep (its finders are refused, not proven here).
    "longcat_flash": dict(
        MLA, num_layers=2, head_dim=4, zero_expert_num=2, ffn_hidden_size=48, expert_ffn_hidden_size=16
    ),
    "kimi_linear": dict(layer_types=HYBRID, **MLA, linear_head_dim=8, linear_num_heads=4),
    "jamba": dict(
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        mamba_d_state=8,
        mamba_dt_rank=8,
    ),
}


# The families proven by tests/bake/test_families_moe.py (and described by tests/core/test_moe_table.py).
FAMILIES = (
    "deepseek_v2",
    "deepseek_v3",
    "glm4_moe",
    "ernie4_5_moe",
    "hunyuan_v1_moe",
    "minimax_m2",
    "phimoe",
    "granitemoe",
    "granitemoe_swa",
    "granitemoeshared",
    "flex_olmo",
    "aria_text",
    "solar_open",
    "cohere2_moe",
    "mellum",
    "afmoe",
    "exaone_moe",
    "kolibri1",
    "dots1",
    "sarvam_moe",
    "hy_v3",
    "beam",
    "flint",
    "laguna",
    "mimo_v2_flash",
    "minimax_m3_vl_text",
    "zaya",
    "llama4_text",
    "llama4",
    "qwen3_next",
    "qwen3_5_moe_text",
    "lara_mini",
    "minimax",
    "granitemoehybrid",
    "jamba",
    "kimi_linear",
    "bailing_hybrid",
    "lfm2_moe",
    "deepseek_v32",
    "glm_moe_dsa",
    "sarvam_mla",
    "glm4_moe_lite",
    "axk1",
    "axk2",
    "qwen3_5_moe",
    "qwen4_exp_text",
    "qwen4_exp",
    "param2moe",
    "minicpm5_moe",
)
# The class a release is saved from where it is not the causal LM (the text model of a multimodal one).
RELEASE_CLASSES = {
    "llama4": "Llama4ForConditionalGeneration",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "qwen4_exp": "Qwen4ExpForConditionalGeneration",
}


def config_fields(cls) -> set[str]:
    """The keyword arguments a config class takes (its dataclass fields, or its __init__'s)."""
    try:
        return {f.name for f in dataclasses.fields(cls)}
    except TypeError:
        return set(inspect.signature(cls.__init__).parameters)


def tiny_moe_config(model_type: str, **overrides):
    """A transformers config object of ``model_type`` with tiny sizes."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type in ("qwen3_5_moe", "qwen4_exp"):  # multimodal wrappers: the tiny text model, a tiny vision model
        vision = dict(
            depth=1,
            hidden_size=16,
            intermediate_size=32,
            num_heads=2,
            out_hidden_size=32,
            patch_size=14,
            temporal_patch_size=2,
            spatial_merge_size=2,
        )
        text = tiny_moe_config(f"{model_type}_text", **overrides).to_dict()
        return CONFIG_MAPPING[model_type](text_config=text, vision_config=vision)
    if model_type == "llama4":  # the multimodal wrapper: the tiny text model and a one-layer vision model
        vision = dict(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
            vision_output_dim=16,
            projector_input_dim=16,
            projector_output_dim=16,
        )
        return CONFIG_MAPPING["llama4"](
            text_config=tiny_moe_config("llama4_text", **overrides).to_dict(),
            vision_config=vision,
            image_token_index=95,
        )

    cls = CONFIG_MAPPING[model_type]
    known = config_fields(cls)
    kw = {k: v for k, v in {**SIZES, **EXPERTS}.items() if k in known}
    layers = overrides.get("num_hidden_layers", SIZES["num_hidden_layers"])
    # per-layer lists follow the number of layers (the last layer's kind repeated)
    family = {
        k: v + v[-1:] * (layers - len(v)) if isinstance(v, list) and len(v) == SIZES["num_hidden_layers"] else v
        for k, v in OVERRIDES.get(model_type, {}).items()
    }
    return cls(**{**kw, **family, **overrides})
