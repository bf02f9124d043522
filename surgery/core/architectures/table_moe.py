"""Mixtures of experts: routing rules, shared experts, stored fused names."""

from __future__ import annotations

from dataclasses import replace

from .experts import ExpertKeys, Experts, ExpertWeights, SharedExpert, SparseLayers, StepRule
from .kinds import Mla
from .layout import Attention, Config, Layers, Layout, Limits, Mlp, Names
from .parts import (
    _DEEPSEEK_EXPERTS,
    _DEEPSEEK_KEYS,
    _FEED_FORWARD,
    _FUSED_GATE_UP,
    _GRANITE_EXPERTS,
    _GRANITE_SHARED,
    _LAYER_TYPES,
    _LLAMA4_EXPERTS,
    _MIXTRAL_WEIGHTS,
    _N_EXPERTS,
    _N_LOCAL,
    _N_ROUTED,
    _QWEN_EXPERTS,
    _QWEN_SHARED,
    _QWEN_SPARSE,
    _QWEN_WEIGHTS,
    _SARVAM_KEYS,
    _first_k_dense,
)
from .records import ConfigKeys, Mixer

_SARVAM_MOE = Layout(
    Names(stored_names=(("self_attn.o_proj.", "attention.dense."), ("embed_tokens.", "word_embeddings."))),
    Attention(q_proj=None, k_proj=None, v_proj=None),
    experts=replace(_DEEPSEEK_EXPERTS, keys=_SARVAM_KEYS, layers=SparseLayers(rule=_first_k_dense(1))),
)

MOE: dict[str, Layout] = {
    # Per-expert names on disk are what transformers' checkpoint conversion mapping splits the fused
    # experts into; config aliases are the config class's attribute_map (tests/core/test_moe_table.py
    # compares every row with both, and its routing rule and sizes with the model transformers builds).
    "glm4_moe": Layout(experts=replace(_DEEPSEEK_EXPERTS, layers=SparseLayers(rule=_first_k_dense(1)))),
    "dots1": Layout(experts=replace(_DEEPSEEK_EXPERTS, layers=SparseLayers(rule=_first_k_dense(0)))),
    # MiniCPM5-MoE: gated attention from one fused q_gate_proj (each head's query, then its output gate),
    # which its releases store as q_proj
    "minicpm5_moe": Layout(
        Names(stored_names=(("self_attn.q_gate_proj.", "self_attn.q_proj."),)),
        Attention(q_proj="self_attn.q_gate_proj", q_gate=True),
        experts=replace(_DEEPSEEK_EXPERTS, layers=SparseLayers("mlp_layer_types", rule=_first_k_dense(1))),
    ),
    "solar_open": Layout(
        experts=replace(_DEEPSEEK_EXPERTS, keys=replace(_DEEPSEEK_KEYS, dense_size_keys=()), layers=SparseLayers()),
    ),
    # Sarvam-MoE releases store Bailing-style attention: attention.dense (o_proj), one fused query_key_value.
    "sarvam_moe": _SARVAM_MOE,
    # Param2-MoE runs on GLM-4-MoE's modeling code and its releases store Sarvam-MoE's names.
    "param2moe": _SARVAM_MOE,
    "ernie4_5_moe": Layout(
        experts=Experts(
            ExpertKeys(("moe_num_experts",), "moe_intermediate_size", aliases=(("num_experts", "moe_num_experts"),)),
            _QWEN_WEIGHTS,
            SharedExpert("mlp.shared_experts", "moe_intermediate_size", count_key="moe_num_shared_experts"),
            SparseLayers(
                rule=StepRule(
                    step_key="moe_layer_interval",
                    first_dense_key="moe_layer_start_index",
                    first_dense_default=1,
                    last_sparse_key="moe_layer_end_index",
                )
            ),
        ),
    ),
    "hunyuan_v1_moe": Layout(
        experts=Experts(
            ExpertKeys(("num_experts",), "intermediate_size", dense_size_keys=(), aliases=_N_EXPERTS),
            _QWEN_WEIGHTS,
            SharedExpert("mlp.shared_mlp", "intermediate_size"),
        ),
    ),
    "hy_v3": Layout(
        Names(stored_names=(("mlp.shared_experts.", "mlp.shared_mlp."),)),
        experts=Experts(
            ExpertKeys(("num_experts",), "moe_intermediate_size", aliases=_N_EXPERTS),
            _QWEN_WEIGHTS,
            SharedExpert("mlp.shared_experts", "moe_intermediate_size", count_key="num_shared_experts"),
            SparseLayers(layer_types_key="mlp_layer_types", rule=StepRule(first_dense_default=1)),
        ),
    ),
    "minimax_m2": Layout(
        experts=Experts(
            ExpertKeys(("num_local_experts",), "intermediate_size", dense_size_keys=(), aliases=_N_LOCAL),
            _MIXTRAL_WEIGHTS,
        ),
    ),
    "phimoe": Layout(
        experts=Experts(ExpertKeys(("num_local_experts",), "intermediate_size", dense_size_keys=()), _MIXTRAL_WEIGHTS)
    ),
    "granitemoe": Layout(experts=_GRANITE_EXPERTS),
    "granitemoe_swa": Layout(
        experts=replace(_GRANITE_EXPERTS, weights=ExpertWeights(None, module="block_sparse_moe.experts"))
    ),
    "granitemoeshared": Layout(experts=_GRANITE_SHARED),
    "flex_olmo": Layout(
        experts=Experts(
            ExpertKeys(("num_experts",), "intermediate_size", dense_size_keys=(), aliases=_N_EXPERTS), _QWEN_WEIGHTS
        ),
    ),
    "aria_text": Layout(
        experts=Experts(
            ExpertKeys(("moe_num_experts",), "intermediate_size", dense_size_keys=()),
            ExpertWeights(None, transposed=True, stored_fused=("mlp.experts.fc1.weight", "mlp.experts.fc2.weight")),
            SharedExpert("mlp.shared_experts", "intermediate_size", count_key="moe_num_shared_experts"),
        ),
    ),
    "cohere2_moe": Layout(
        experts=Experts(
            ExpertKeys(
                ("num_experts",),
                "intermediate_size",
                dense_size_keys=("prefix_dense_intermediate_size", "intermediate_size"),
            ),
            _QWEN_WEIGHTS,
            SharedExpert("mlp.shared_experts", "intermediate_size", count_key="num_shared_experts"),
            SparseLayers(layer_types_key="mlp_layer_types"),
        ),
    ),
    "mellum": Layout(
        experts=Experts(
            ExpertKeys(("num_local_experts",), "moe_intermediate_size", aliases=_N_LOCAL),
            _QWEN_WEIGHTS,
            layers=SparseLayers(layer_types_key="mlp_layer_types"),
        ),
    ),
    "afmoe": Layout(
        experts=Experts(
            ExpertKeys(("num_experts",), "moe_intermediate_size"),
            _QWEN_WEIGHTS,
            SharedExpert("mlp.shared_experts", "moe_intermediate_size", count_key="num_shared_experts"),
            SparseLayers(rule=StepRule(first_dense_key="num_dense_layers", first_dense_default=1)),
        ),
    ),
    "exaone_moe": Layout(
        experts=Experts(
            ExpertKeys(("num_experts",), "moe_intermediate_size"),
            _QWEN_WEIGHTS,
            SharedExpert("mlp.shared_experts", "moe_intermediate_size", count_key="num_shared_experts"),
            SparseLayers(
                layer_types_key="mlp_layer_types",
                rule=StepRule(first_dense_key="first_k_dense_replace", first_dense_default=1),
            ),
        ),
    ),
    "kolibri1": Layout(
        experts=Experts(
            ExpertKeys(("num_local_experts",), "moe_intermediate_size", dense_size_keys=(), aliases=_N_LOCAL),
            _QWEN_WEIGHTS,
            SharedExpert("mlp.shared_experts", "shared_expert_intermediate_size"),
        ),
    ),
    "beam": Layout(
        experts=Experts(
            ExpertKeys(("num_experts",), "moe_intermediate_size"),
            _QWEN_WEIGHTS,
            layers=SparseLayers(layer_types_key="mlp_layer_types", rule=StepRule(first_dense_default=3)),
        ),
    ),
    "flint": Layout(
        experts=Experts(
            ExpertKeys(("num_experts",), "moe_intermediate_size"), _QWEN_WEIGHTS, _QWEN_SHARED, _QWEN_SPARSE
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
            ExpertKeys(("num_experts",), "moe_intermediate_size"),
            _QWEN_WEIGHTS,
            SharedExpert("mlp.shared_experts", "shared_expert_intermediate_size"),
            SparseLayers(layer_types_key="mlp_layer_types", rule=StepRule(first_dense_default=1)),
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
            ExpertKeys(("n_routed_experts",), "moe_intermediate_size", aliases=_N_ROUTED),
            _QWEN_WEIGHTS,
            layers=SparseLayers(layer_types_key="mlp_layer_types", rule=StepRule(first_dense_default=1)),
        ),
    ),
    # MiniMax-M3: the dense MLPs and the shared expert hold one fused [gate; up] matrix.
    "minimax_m3_vl_text": Layout(
        mlp=_FUSED_GATE_UP,
        experts=Experts(
            ExpertKeys(
                ("num_local_experts",),
                "intermediate_size",
                dense_size_keys=("dense_intermediate_size",),
                aliases=_N_LOCAL,
            ),
            ExpertWeights(None),
            SharedExpert("mlp.shared_experts", "shared_intermediate_size", inputs=("gate_up_proj",), fused=True),
            SparseLayers(layer_types_key="mlp_layer_types"),
        ),
    ),
    # ZAYA: q/k through convolutions, v from two projections; its heads meet in o_proj as usual.
    "zaya": Layout(
        attention=Attention(q_proj="self_attn.qkv_proj.q_proj", k_proj="self_attn.qkv_proj.k_proj", v_proj=None),
        experts=Experts(ExpertKeys(("num_experts",), "moe_intermediate_size", dense_size_keys=()), ExpertWeights(None)),
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
            ExpertKeys(
                ("n_routed_experts",),
                "expert_ffn_hidden_size",
                dense_size_keys=("ffn_hidden_size",),
                zero_key="zero_expert_num",
                aliases=(
                    ("num_local_experts", "n_routed_experts"),
                    ("intermediate_size", "ffn_hidden_size"),
                    ("moe_intermediate_size", "expert_ffn_hidden_size"),
                ),
            ),
            ExpertWeights(_QWEN_EXPERTS, dispatch="looped"),
            layers=SparseLayers(rule=StepRule(step=2, offset=0), with_dense=True),
        ),
    ),
    # MiniMax-Text-01: lightning (linear) attention in the linear_attention layers, its output through out_proj.
    "minimax": Layout(
        layers=Layers(
            _LAYER_TYPES, mixer=Mixer("self_attn.out_proj", (("num_attention_heads", "head_dim"), ("hidden_size",)))
        ),
        experts=Experts(
            ExpertKeys(("num_local_experts",), "intermediate_size", dense_size_keys=(), aliases=_N_LOCAL),
            _MIXTRAL_WEIGHTS,
        ),
    ),
}
