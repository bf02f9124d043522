"""Mixtures of experts: routing rules, shared experts, stored fused names."""

from __future__ import annotations

from dataclasses import replace

from .experts import Experts
from .kinds import Mla
from .layout import Attention, Config, Layers, Layout, Limits, Mlp, Names
from .parts import (
    _DEEPSEEK_EXPERTS,
    _FEED_FORWARD,
    _FUSED_GATE_UP,
    _GRANITE_EXPERTS,
    _GRANITE_SHARED,
    _LAYER_TYPES,
    _LLAMA4_EXPERTS,
    _MIXTRAL_EXPERTS,
    _N_EXPERTS,
    _N_LOCAL,
    _N_ROUTED,
    _QWEN_EXPERTS,
    _SARVAM,
)
from .records import ConfigKeys, Mixer

_SARVAM_MOE = Layout(
    Names(stored_names=(("self_attn.o_proj.", "attention.dense."), ("embed_tokens.", "word_embeddings."))),
    Attention(q_proj=None, k_proj=None, v_proj=None),
    experts=replace(_DEEPSEEK_EXPERTS, layer_types_key=None, first_dense_default=1, aliases=_SARVAM),
)

MOE: dict[str, Layout] = {
    # Per-expert names on disk are what transformers' checkpoint conversion mapping splits the fused
    # experts into; config aliases are the config class's attribute_map (tests/core/test_moe_table.py
    # compares every row with both, and its routing rule and sizes with the model transformers builds).
    "glm4_moe": Layout(experts=replace(_DEEPSEEK_EXPERTS, layer_types_key=None, first_dense_default=1)),
    "dots1": Layout(experts=replace(_DEEPSEEK_EXPERTS, layer_types_key=None, first_dense_default=0)),
    # MiniCPM5-MoE: gated attention from one fused q_gate_proj (each head's query, then its output gate),
    # which its releases store as q_proj
    "minicpm5_moe": Layout(
        Names(stored_names=(("self_attn.q_gate_proj.", "self_attn.q_proj."),)),
        Attention(q_proj="self_attn.q_gate_proj", q_gate=True),
        experts=replace(_DEEPSEEK_EXPERTS, first_dense_default=1),
    ),
    "solar_open": Layout(
        experts=replace(
            _DEEPSEEK_EXPERTS, layer_types_key=None, first_dense_key=None, first_dense_default=0, dense_size_keys=()
        ),
    ),
    # Sarvam-MoE releases store Bailing-style attention: attention.dense (o_proj), one fused query_key_value.
    "sarvam_moe": _SARVAM_MOE,
    # Param2-MoE runs on GLM-4-MoE's modeling code and its releases store Sarvam-MoE's names.
    "param2moe": _SARVAM_MOE,
    "ernie4_5_moe": Layout(
        experts=Experts(
            ("moe_num_experts",),
            "moe_intermediate_size",
            _QWEN_EXPERTS,
            shared="mlp.shared_experts",
            shared_size_key="moe_intermediate_size",
            shared_count_key="moe_num_shared_experts",
            sparse_step_key="moe_layer_interval",
            first_dense_key="moe_layer_start_index",
            first_dense_default=1,
            last_sparse_key="moe_layer_end_index",
            aliases=(("num_experts", "moe_num_experts"),),
        ),
    ),
    "hunyuan_v1_moe": Layout(
        experts=Experts(
            ("num_experts",),
            "intermediate_size",
            _QWEN_EXPERTS,
            shared="mlp.shared_mlp",
            shared_size_key="intermediate_size",
            dense_size_keys=(),
            aliases=_N_EXPERTS,
        ),
    ),
    "hy_v3": Layout(
        Names(stored_names=(("mlp.shared_experts.", "mlp.shared_mlp."),)),
        experts=Experts(
            ("num_experts",),
            "moe_intermediate_size",
            _QWEN_EXPERTS,
            shared="mlp.shared_experts",
            shared_size_key="moe_intermediate_size",
            shared_count_key="num_shared_experts",
            layer_types_key="mlp_layer_types",
            first_dense_default=1,
            aliases=_N_EXPERTS,
        ),
    ),
    "minimax_m2": Layout(
        experts=Experts(
            ("num_local_experts",), "intermediate_size", _MIXTRAL_EXPERTS, dense_size_keys=(), aliases=_N_LOCAL
        ),
    ),
    "phimoe": Layout(
        experts=Experts(("num_local_experts",), "intermediate_size", _MIXTRAL_EXPERTS, dense_size_keys=())
    ),
    "granitemoe": Layout(experts=_GRANITE_EXPERTS),
    "granitemoe_swa": Layout(experts=replace(_GRANITE_EXPERTS, stored_fused=None)),
    "granitemoeshared": Layout(experts=_GRANITE_SHARED),
    "flex_olmo": Layout(
        experts=Experts(("num_experts",), "intermediate_size", _QWEN_EXPERTS, dense_size_keys=(), aliases=_N_EXPERTS),
    ),
    "aria_text": Layout(
        experts=Experts(
            ("moe_num_experts",),
            "intermediate_size",
            None,
            transposed=True,
            stored_fused=("mlp.experts.fc1.weight", "mlp.experts.fc2.weight"),
            shared="mlp.shared_experts",
            shared_size_key="intermediate_size",
            shared_count_key="moe_num_shared_experts",
            dense_size_keys=(),
        ),
    ),
    "cohere2_moe": Layout(
        experts=Experts(
            ("num_experts",),
            "intermediate_size",
            _QWEN_EXPERTS,
            shared="mlp.shared_experts",
            shared_size_key="intermediate_size",
            shared_count_key="num_shared_experts",
            dense_size_keys=("prefix_dense_intermediate_size", "intermediate_size"),
            layer_types_key="mlp_layer_types",
        ),
    ),
    "mellum": Layout(
        experts=Experts(
            ("num_local_experts",),
            "moe_intermediate_size",
            _QWEN_EXPERTS,
            layer_types_key="mlp_layer_types",
            aliases=_N_LOCAL,
        ),
    ),
    "afmoe": Layout(
        experts=Experts(
            ("num_experts",),
            "moe_intermediate_size",
            _QWEN_EXPERTS,
            shared="mlp.shared_experts",
            shared_size_key="moe_intermediate_size",
            shared_count_key="num_shared_experts",
            first_dense_key="num_dense_layers",
            first_dense_default=1,
        ),
    ),
    "exaone_moe": Layout(
        experts=Experts(
            ("num_experts",),
            "moe_intermediate_size",
            _QWEN_EXPERTS,
            shared="mlp.shared_experts",
            shared_size_key="moe_intermediate_size",
            shared_count_key="num_shared_experts",
            layer_types_key="mlp_layer_types",
            first_dense_key="first_k_dense_replace",
            first_dense_default=1,
        ),
    ),
    "kolibri1": Layout(
        experts=Experts(
            ("num_local_experts",),
            "moe_intermediate_size",
            _QWEN_EXPERTS,
            shared="mlp.shared_experts",
            shared_size_key="shared_expert_intermediate_size",
            dense_size_keys=(),
            aliases=_N_LOCAL,
        ),
    ),
    "beam": Layout(
        experts=Experts(
            ("num_experts",),
            "moe_intermediate_size",
            _QWEN_EXPERTS,
            layer_types_key="mlp_layer_types",
            first_dense_default=3,
        ),
    ),
    "flint": Layout(
        experts=Experts(
            ("num_experts",),
            "moe_intermediate_size",
            _QWEN_EXPERTS,
            shared="mlp.shared_expert",
            shared_size_key="shared_expert_intermediate_size",
            sparse_step_key="decoder_sparse_step",
            dense_layers_key="mlp_only_layers",
        ),
    ),
    "laguna": Layout(
        Names(stored_names=(("mlp.shared_experts.", "mlp.shared_expert."),)),
        limits=Limits(
            head_refusal=(
                "attention heads differ per layer (num_attention_heads_per_layer) and are gated per head: head edits "
                "on laguna are not in the table yet; edit its MLP and expert neurons"
            )
        ),
        experts=Experts(
            ("num_experts",),
            "moe_intermediate_size",
            _QWEN_EXPERTS,
            shared="mlp.shared_experts",
            shared_size_key="shared_expert_intermediate_size",
            layer_types_key="mlp_layer_types",
            first_dense_default=1,
        ),
    ),
    "mimo_v2_flash": Layout(
        limits=Limits(
            head_refusal=(
                "value heads are v_head_dim wide, not head_dim (o_proj input = heads × v_head_dim): head edits on "
                "mimo_v2_flash are not in the table yet; edit its MLP and expert neurons"
            )
        ),
        experts=Experts(
            ("n_routed_experts",),
            "moe_intermediate_size",
            _QWEN_EXPERTS,
            layer_types_key="mlp_layer_types",
            first_dense_default=1,
            aliases=_N_ROUTED,
        ),
    ),
    # MiniMax-M3: the dense MLPs and the shared expert hold one fused [gate; up] matrix.
    "minimax_m3_vl_text": Layout(
        mlp=_FUSED_GATE_UP,
        experts=Experts(
            ("num_local_experts",),
            "intermediate_size",
            None,
            shared="mlp.shared_experts",
            shared_size_key="shared_intermediate_size",
            shared_inputs=("gate_up_proj",),
            shared_fused=True,
            dense_size_keys=("dense_intermediate_size",),
            layer_types_key="mlp_layer_types",
            aliases=_N_LOCAL,
        ),
    ),
    # ZAYA: q/k through convolutions, v from two projections; its heads meet in o_proj as usual.
    "zaya": Layout(
        attention=Attention(q_proj="self_attn.qkv_proj.q_proj", k_proj="self_attn.qkv_proj.k_proj", v_proj=None),
        experts=Experts(("num_experts",), "moe_intermediate_size", None, dense_size_keys=()),
    ),
    "llama4_text": Layout(
        mlp=_FEED_FORWARD,
        experts=_LLAMA4_EXPERTS,
    ),
    # LongCat-Flash: each decoder layer holds two MLA attention blocks, each followed by a dense MLP
    # (ModuleLists self_attn and mlps), and one mixture of experts that reads the first block's MLP input
    # and adds to the layer's output (a shortcut). The table's layers are the two sub-layers (layer 2L + i
    # = block i of decoder layer L, transformers' cache index of its attention); the experts belong to the
    # first (even layers). The router also picks zero_expert_num weightless identity experts.
    "longcat_flash": Layout(
        attention=Attention(
            o_proj="self_attn.{sub}.o_proj",
            q_proj=None,
            k_proj=None,
            v_proj=None,
            mla=Mla(
                q_proj=None,
                q_a_proj="self_attn.{sub}.q_a_proj",
                q_b_proj="self_attn.{sub}.q_b_proj",
                kv_a_proj="self_attn.{sub}.kv_a_proj_with_mqa",
                kv_b_proj="self_attn.{sub}.kv_b_proj",
            ),
        ),
        mlp=Mlp(down_proj="mlps.{sub}.down_proj", gate_proj="mlps.{sub}.gate_proj", up_proj="mlps.{sub}.up_proj"),
        layers=Layers(sub_layers=2),
        limits=Limits(
            find_refusal=(
                "each decoder layer runs two attention blocks and two MLPs (and a shortcut mixture of experts) in "
                "one forward, and the finders read and resume whole decoder layers"
            )
        ),
        config=Config(ConfigKeys(num_hidden_layers="num_layers", intermediate_size="ffn_hidden_size")),
        experts=Experts(
            ("n_routed_experts",),
            "expert_ffn_hidden_size",
            _QWEN_EXPERTS,
            dense_size_keys=("ffn_hidden_size",),
            with_dense=True,
            sparse_step=2,
            sparse_offset=0,
            dispatch="looped",
            zero_key="zero_expert_num",
            aliases=(
                ("num_local_experts", "n_routed_experts"),
                ("intermediate_size", "ffn_hidden_size"),
                ("moe_intermediate_size", "expert_ffn_hidden_size"),
            ),
        ),
    ),
    # MiniMax-Text-01: lightning (linear) attention in the linear_attention layers, its output through out_proj.
    "minimax": Layout(
        layers=Layers(
            _LAYER_TYPES, mixer=Mixer("self_attn.out_proj", (("num_attention_heads", "head_dim"), ("hidden_size",)))
        ),
        experts=Experts(
            ("num_local_experts",), "intermediate_size", _MIXTRAL_EXPERTS, dense_size_keys=(), aliases=_N_LOCAL
        ),
    ),
}
