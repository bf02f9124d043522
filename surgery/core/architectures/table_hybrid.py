"""MLA, DeepSeek-V4's grouped output and hybrid layer kinds."""

from __future__ import annotations

from dataclasses import replace

from .experts import ExpertKeys, Experts, ExpertWeights, SparseLayers, StepRule
from .kinds import GroupedOutput, KindRule, LayerKinds, Mla
from .layout import Attention, Config, Layers, Layout, Limits, Mlp, Names, Tail
from .parts import (
    _CONV_OUT,
    _DEEPSEEK_EXPERTS,
    _DEEPSEEK_KEYS,
    _DELTA_OUT,
    _FEED_FORWARD,
    _GRANITE_SHARED,
    _KIMI_EXPERTS,
    _LAYER_TYPES,
    _LFM_FEED_FORWARD,
    _MAMBA_LORA,
    _MAMBA_OUT,
    _MIXTRAL_WEIGHTS,
    _MLA_ATTENTION,
    _N_EXPERTS,
    _QWEN4_HEADS,
    _QWEN35_EXPERTS,
    _QWEN_EXPERTS,
    _QWEN_HYBRID,
    _QWEN_SHARED,
    _QWEN_SPARSE,
    _QWEN_WEIGHTS,
    _SARVAM_KEYS,
    _SPARSE_LIST,
    _first_k_dense,
    _nemotron_h_kinds,
)
from .records import ConfigKeys, Mixer

_NO_KV_CACHE = Limits(kv_cache=False)
_QWEN_GATED = Attention(q_gate=True)
# A.X K: DeepSeek's experts every moe_layer_freq-th layer from first_k_dense_replace.
_AXK_RULE = StepRule("moe_layer_freq", offset=0, first_dense_key="first_k_dense_replace", first_dense_default=1)
_AXK_EXPERTS = replace(_DEEPSEEK_EXPERTS, layers=SparseLayers("mlp_layer_types", rule=_AXK_RULE))

HYBRID: dict[str, Layout] = {
    # MLA: a head is its v_head_dim columns of o_proj; the experts of the MoE families as in table_moe.
    "minicpm3": Layout(attention=_MLA_ATTENTION, tail=Tail(logit_scaling="logits_scaling")),
    "youtu": Layout(attention=_MLA_ATTENTION),
    "deepseek_v2": Layout(
        attention=_MLA_ATTENTION,
        experts=replace(
            _DEEPSEEK_EXPERTS,
            keys=replace(_DEEPSEEK_KEYS, aliases=(("num_experts", "n_routed_experts"),)),
            layers=SparseLayers(rule=_first_k_dense(0)),
        ),
    ),
    "deepseek_v3": Layout(
        attention=_MLA_ATTENTION, experts=replace(_DEEPSEEK_EXPERTS, layers=SparseLayers(rule=_first_k_dense(3)))
    ),
    "sarvam_mla": Layout(
        attention=_MLA_ATTENTION,
        experts=replace(_DEEPSEEK_EXPERTS, keys=_SARVAM_KEYS, layers=SparseLayers(rule=_first_k_dense(1))),
    ),
    # DeepSeek sparse attention: an indexer picks each query's keys and keeps its own key cache.
    "deepseek_v32": Layout(attention=_MLA_ATTENTION, experts=_DEEPSEEK_EXPERTS, limits=_NO_KV_CACHE),
    "glm_moe_dsa": Layout(attention=_MLA_ATTENTION, experts=_DEEPSEEK_EXPERTS, limits=_NO_KV_CACHE),
    # its config class reads head_dim as qk_rope_head_dim (a head's width in o_proj is MLA's v_head_dim)
    "glm4_moe_lite": Layout(
        attention=_MLA_ATTENTION,
        experts=replace(
            _DEEPSEEK_EXPERTS, layers=SparseLayers("mlp_layer_types", rule=StepRule(first_dense_default=1))
        ),
        config=Config(ConfigKeys(head_dim="qk_rope_head_dim")),
    ),
    "axk1": Layout(
        attention=_MLA_ATTENTION,
        experts=_AXK_EXPERTS,
    ),
    # A.X K2: MLA whose queries and output gate come from one fused q_gate_proj (no q_b_proj), DSA indexer.
    "axk2": Layout(
        attention=replace(_MLA_ATTENTION, mla=Mla(q_b_proj=None)),
        experts=_AXK_EXPERTS,
        limits=_NO_KV_CACHE,
    ),
    # Hunyuan-V4: MLA with hyper-connection residual streams around each block (linear in o_proj's
    # output, so a head scale is still exact); its dense MLP's gate is stored as mlp.linear_gate.
    "hy_v4": Layout(
        Names(stored_names=(("mlp.gate_proj", "mlp.linear_gate"),)),
        _MLA_ATTENTION,
        layers=Layers(mlp_kinds=_SPARSE_LIST),
        tail=Tail(final_head="hc_head"),
        limits=_NO_KV_CACHE,
    ),
    # DeepSeek-V4: heads through the grouped o_a_proj; every MLP is a mixture of experts.
    "deepseek_v4": Layout(
        Names(
            ("model.layers.{layer}.", "layers.{layer}."),
            stored_names=(
                ("self_attn.o_a_proj", "attn.wo_a"),
                ("self_attn.o_b_proj", "attn.wo_b"),
                ("self_attn.kv_proj", "attn.wkv"),
            ),
        ),
        Attention(o_proj="self_attn.o_a_proj", q_proj=None, k_proj=None, v_proj=None, grouped_output=GroupedOutput()),
        layers=Layers(mlp_kinds=LayerKinds((KindRule("list", ("mlp_layer_types",)),), editable=())),
        tail=Tail(final_head="hc_head"),
        limits=Limits(kv_cache=False, token_keys=False),
        config=Config(ConfigKeys(intermediate_size="moe_intermediate_size")),  # its config class's attribute_map
    ),
    # Hybrid layers: heads in the softmax-attention layers only, MLP and expert neurons where they are.
    # (each with its linear-attention layers' output projection, a residual writer: Layers.mixer)
    "qwen3_5_text": Layout(attention=_QWEN_GATED, layers=Layers(_QWEN_HYBRID, mixer=_DELTA_OUT)),
    "qwen3_next": Layout(
        attention=_QWEN_GATED,
        layers=Layers(_QWEN_HYBRID, mixer=_DELTA_OUT),
        experts=Experts(
            ExpertKeys(("num_experts",), "moe_intermediate_size"), _QWEN_WEIGHTS, _QWEN_SHARED, _QWEN_SPARSE
        ),
    ),
    "qwen3_5_moe_text": Layout(
        attention=_QWEN_GATED, layers=Layers(_QWEN_HYBRID, mixer=_DELTA_OUT), experts=_QWEN35_EXPERTS
    ),
    "lara_mini": Layout(
        layers=Layers(
            LayerKinds((KindRule("list", ("layer_types",)),), ("full_attention", "sliding_attention")), mixer=_DELTA_OUT
        ),
        experts=replace(_QWEN35_EXPERTS, weights=ExpertWeights(None)),
    ),
    "olmo_hybrid": Layout(layers=Layers(_LAYER_TYPES, mixer=replace(_DELTA_OUT, module="linear_attn.o_proj"))),
    "lfm2": Layout(
        attention=Attention(o_proj="self_attn.out_proj"),
        mlp=replace(
            _LFM_FEED_FORWARD,
            ffn_adjust=("block_auto_adjust_ff_dim", "block_ffn_dim_multiplier", "block_multiple_of"),
        ),
        layers=Layers(
            LayerKinds(
                (
                    KindRule("list", ("layer_types",)),
                    KindRule("indices", ("full_attn_idxs",), ("full_attention", "conv")),
                ),
                ("full_attention",),
            ),
            mixer=_CONV_OUT,
        ),
        tail=Tail(final_norm="embedding_norm"),
    ),
    "lfm2_moe": Layout(
        attention=Attention(o_proj="self_attn.out_proj"),
        mlp=_LFM_FEED_FORWARD,
        layers=Layers(_LAYER_TYPES, mixer=_CONV_OUT),
        tail=Tail(final_norm="embedding_norm"),
        experts=Experts(
            ExpertKeys(("num_experts",), "moe_intermediate_size"),
            ExpertWeights(
                tuple(f"feed_forward.experts.{{expert}}.{w}" for w in ("w1", "w3", "w2")), module="feed_forward.experts"
            ),
            layers=SparseLayers(rule=StepRule(first_dense_key="num_dense_layers", first_dense_default=2)),
        ),
    ),
    "lfm3": Layout(
        mlp=_LFM_FEED_FORWARD,
        layers=Layers(
            LayerKinds((KindRule("list", ("layer_types",)),), ("full_attention", "sliding_attention")), mixer=_CONV_OUT
        ),
        tail=Tail(final_norm="embedding_norm"),
    ),
    # Falcon-H1: attention and a state-space block side by side in every layer.
    "falcon_h1": Layout(
        mlp=_FEED_FORWARD,
        layers=Layers(
            mixer=Mixer(
                "mamba.out_proj",
                (("mamba_d_ssm",), ("mamba_expand", "hidden_size")),
                kinds=None,
                lora_refusal=_MAMBA_LORA,
            )
        ),
        tail=Tail(final_norm="final_layernorm"),
        limits=_NO_KV_CACHE,
    ),
    "bamba": Layout(
        mlp=_FEED_FORWARD,
        layers=Layers(
            LayerKinds((KindRule("indices", ("attn_layer_indices",)),), ("full_attention",)), mixer=_MAMBA_OUT
        ),
        tail=Tail(final_norm="final_layernorm"),
    ),
    "jamba": Layout(
        mlp=_FEED_FORWARD,
        layers=Layers(
            LayerKinds((KindRule("period", ("attn_layer_period", "attn_layer_offset")),), ("full_attention",)),
            mixer=_MAMBA_OUT,
        ),
        tail=Tail(final_norm="final_layernorm"),
        experts=Experts(
            ExpertKeys(("num_experts",), "intermediate_size", aliases=_N_EXPERTS),
            ExpertWeights(
                tuple(n.replace("mlp.", "feed_forward.") for n in _QWEN_EXPERTS), module="feed_forward.experts"
            ),
            layers=SparseLayers(rule=StepRule(step_key="expert_layer_period", offset_key="expert_layer_offset")),
        ),
    ),
    # Granite-4 hybrids: Mamba-2 or attention per layer, experts and a shared MLP in every layer.
    "granitemoehybrid": Layout(
        layers=Layers(
            LayerKinds(
                (KindRule("list", ("layer_types",)), KindRule("list", ("layers_block_type",))), ("full_attention",)
            ),
            mixer=_MAMBA_OUT,
        ),
        experts=_GRANITE_SHARED,
    ),
    # Nemotron-H: one block per layer (state-space, attention, ungated MLP or experts); stored under backbone.
    "nemotron_h": Layout(
        Names(("model.layers.{layer}.", "backbone.layers.{layer}."), embeddings="embeddings"),
        Attention(o_proj="mixer.o_proj", q_proj="mixer.q_proj", k_proj="mixer.k_proj", v_proj="mixer.v_proj"),
        Mlp(down_proj="mixer.down_proj", gate_proj=None, up_proj="mixer.up_proj"),
        layers=Layers(
            _nemotron_h_kinds("full_attention"),
            _nemotron_h_kinds("mlp"),
            mixer=Mixer("mixer.out_proj", (("mamba_num_heads", "mamba_head_dim"),), lora_refusal=_MAMBA_LORA),
        ),
        tail=Tail(final_norm="norm_f"),
    ),
    "recurrent_gemma": Layout(
        attention=Attention(
            o_proj="temporal_block.o_proj",
            q_proj="temporal_block.q_proj",
            k_proj="temporal_block.k_proj",
            v_proj="temporal_block.v_proj",
        ),
        mlp=Mlp(
            down_proj="mlp_block.down_proj",
            gate_proj="mlp_block.gate_proj",
            up_proj="mlp_block.up_proj",
            ffn_divisor=2,
        ),
        layers=Layers(
            LayerKinds(
                (
                    KindRule(
                        "cycle",
                        ("block_types",),
                        names=(("recurrent", "linear_attention"), ("attention", "sliding_attention")),
                    ),
                ),
                ("sliding_attention",),
            ),
            mixer=Mixer("temporal_block.linear_out", (("lru_width",), ("hidden_size",))),
        ),
        tail=Tail(final_norm="final_norm", logit_softcap="logits_soft_cap"),
    ),
    # Kimi-Linear: MLA in its full-attention layers; its releases keep the MLP under block_sparse_moe
    # (dense layers too), experts Mixtral-style.
    "kimi_linear": Layout(
        Names(stored_names=(("mlp.", "block_sparse_moe."),)),
        _MLA_ATTENTION,
        layers=Layers(
            LayerKinds(
                (
                    KindRule("list", ("layer_types",)),
                    KindRule("indices", ("linear_attn_config.full_attn_layers",), one_based=True),
                ),
                ("full_attention",),
            ),
            # its delta-attention layers' output projection, as wide as their heads (linear_attn_config first)
            mixer=Mixer(
                "self_attn.o_proj",
                (
                    ("linear_attn_config.num_heads", "linear_attn_config.head_dim"),
                    ("linear_num_heads", "linear_head_dim"),
                ),
            ),
        ),
        experts=replace(
            _KIMI_EXPERTS, weights=_MIXTRAL_WEIGHTS, layers=SparseLayers("mlp_layer_types", rule=_first_k_dense(1))
        ),
    ),
    # Ling/Bailing hybrid: MLA in its full-attention layers, stored under attention.* (o_proj as dense).
    "bailing_hybrid": Layout(
        Names(
            stored_names=(
                ("self_attn.o_proj", "attention.dense"),
                ("self_attn.", "attention."),
                ("embed_tokens.", "word_embeddings."),
            )
        ),
        _MLA_ATTENTION,
        layers=Layers(
            LayerKinds(
                (KindRule("list", ("layer_types",)), KindRule("interval", ("layer_group_size",))), ("full_attention",)
            ),
            # its linear-attention layers' output projection (stored as attention.dense too): heads × head_dim
            mixer=Mixer("self_attn.o_proj", (("num_attention_heads", "head_dim"),)),
        ),
        experts=replace(_KIMI_EXPERTS, layers=SparseLayers("mlp_layer_types", rule=_first_k_dense(2))),
    ),
    # Qwen4-exp: QSA-indexed attention (gated, every fourth layer) between gated delta-net layers, inside
    # hyper-connection residual streams.
    "qwen4_exp_text": Layout(limits=Limits(head_refusal=_QWEN4_HEADS), experts=_QWEN35_EXPERTS),
}
