"""Pieces the table's rows share: layer prefixes, expert layouts, MLA attention and layer kinds."""

from __future__ import annotations

from dataclasses import replace

from .experts import ExpertKeys, Experts, ExpertWeights, SharedExpert, SparseLayers, StepRule
from .kinds import KindRule, LayerKinds, Mla
from .layout import Attention, Mlp
from .records import Mixer

_DECODER = ("model.layers.{layer}.",)
# A multimodal wrapper's text decoder: where transformers 5 keeps it in memory, and where it (and
# releases of transformers < 4.52) saves it.
_WRAPPED = ("model.language_model.layers.{layer}.", "language_model.model.layers.{layer}.")
# Fused gate/up (Phi-3, GLM): one (2I, H) matrix.
_FUSED_GATE_UP = Mlp(gate_proj=None, up_proj=None, gate_up_proj="mlp.gate_up_proj")
# The MLP under feed_forward (Llama 4, Falcon-H1, Bamba, Jamba).
_FEED_FORWARD = Mlp(
    down_proj="feed_forward.down_proj", gate_proj="feed_forward.gate_proj", up_proj="feed_forward.up_proj"
)
# LFM2's MLP: w1 = gate, w3 = up, w2 = down.
_LFM_FEED_FORWARD = Mlp(down_proj="feed_forward.w2", gate_proj="feed_forward.w1", up_proj="feed_forward.w3")
_QWEN_EXPERTS = ("mlp.experts.{expert}.gate_proj", "mlp.experts.{expert}.up_proj", "mlp.experts.{expert}.down_proj")

# Mixtral's per-expert names: w1 = gate, w3 = up, w2 = down.
_MIXTRAL_EXPERTS = (
    "block_sparse_moe.experts.{expert}.w1",
    "block_sparse_moe.experts.{expert}.w3",
    "block_sparse_moe.experts.{expert}.w2",
)
_QWEN_WEIGHTS = ExpertWeights(_QWEN_EXPERTS)
_MIXTRAL_WEIGHTS = ExpertWeights(_MIXTRAL_EXPERTS)
# Granite-MoE releases store the fused experts under names of their own.
_GRANITE_EXPERTS = Experts(
    ExpertKeys(("num_local_experts",), "intermediate_size", dense_size_keys=()),
    ExpertWeights(
        None,
        module="block_sparse_moe.experts",
        stored_fused=("block_sparse_moe.input_linear.weight", "block_sparse_moe.output_linear.weight"),
    ),
)
# Llama 4: fused [E, H, 2I] experts on disk too, a shared expert, dense MLPs interleaved (moe_layers).
_LLAMA4_EXPERTS = Experts(
    ExpertKeys(("num_local_experts",), "intermediate_size", dense_size_keys=("intermediate_size_mlp",)),
    ExpertWeights(None, module="feed_forward.experts", transposed=True, dispatch="dense"),
    SharedExpert("feed_forward.shared_expert", "intermediate_size"),
    SparseLayers(sparse_list_key="moe_layers", rule=StepRule(step_key="interleave_moe_layer_step")),
)
# DeepSeek-V3.2 and its kin: a per-layer list of MLP kinds, else the first first_k_dense_replace dense.
_DEEPSEEK_KEYS = ExpertKeys(
    ("n_routed_experts",), "moe_intermediate_size", aliases=(("num_local_experts", "n_routed_experts"),)
)
_DEEPSEEK_SHARED = SharedExpert("mlp.shared_experts", "moe_intermediate_size", count_key="n_shared_experts")


def _first_k_dense(default: int) -> StepRule:
    """Every layer routes but the first first_k_dense_replace (``default`` where config.json lacks it)."""
    return StepRule(first_dense_key="first_k_dense_replace", first_dense_default=default)


_DEEPSEEK_EXPERTS = Experts(
    _DEEPSEEK_KEYS,
    _QWEN_WEIGHTS,
    _DEEPSEEK_SHARED,
    SparseLayers(layer_types_key="mlp_layer_types", rule=_first_k_dense(3)),
)
# config.json spellings of the expert count (the config classes' attribute_map).
_N_LOCAL = (("num_experts", "num_local_experts"),)
_N_EXPERTS = (("num_local_experts", "num_experts"),)
_N_ROUTED = (("num_local_experts", "n_routed_experts"),)
_SARVAM = (
    ("num_experts", "n_routed_experts"),
    ("num_local_experts", "n_routed_experts"),
    ("num_shared_experts", "n_shared_experts"),
)
_SARVAM_KEYS = replace(_DEEPSEEK_KEYS, aliases=_SARVAM)
_GRANITE_SHARED = replace(
    _GRANITE_EXPERTS,
    shared=SharedExpert(
        "shared_mlp", "shared_intermediate_size", inputs=("input_linear",), down="output_linear", fused=True
    ),
)
# Qwen-MoE's shared expert, and its rule: experts where layer ∉ mlp_only_layers and (layer+1) % step == 0.
_QWEN_SHARED = SharedExpert("mlp.shared_expert", "shared_expert_intermediate_size")
_QWEN_SPARSE = SparseLayers(rule=StepRule(step_key="decoder_sparse_step", dense_layers_key="mlp_only_layers"))
_QWEN35_EXPERTS = Experts(
    ExpertKeys(("num_experts",), "moe_intermediate_size", dense_size_keys=()), _QWEN_WEIGHTS, _QWEN_SHARED
)
_KIMI_EXPERTS = Experts(
    ExpertKeys(
        ("num_experts",),
        "moe_intermediate_size",
        aliases=(("num_local_experts", "num_experts"), ("n_shared_experts", "num_shared_experts")),
    ),
    _QWEN_WEIGHTS,
    SharedExpert("mlp.shared_experts", "moe_intermediate_size", count_key="num_shared_experts"),
    SparseLayers(layer_types_key="mlp_layer_types", rule=_first_k_dense(0)),
)
_QWEN4_HEADS = (
    "its attention layers pick their keys through a QSA indexer and sit inside hyper-connection residual "
    "streams: head edits on qwen4_exp are not in the table yet; edit its expert neurons"
)

# MLA rows: no q/k/v of their own (Mla names the matrices); the MLP kinds of DeepSeek-style MoE configs.
_MLA_ATTENTION = Attention(q_proj=None, k_proj=None, v_proj=None, mla=Mla())
_SPARSE_LIST = LayerKinds((KindRule("list", ("mlp_layer_types",)),), editable=("dense",))
_DEEPSEEK_MLP = LayerKinds(
    (KindRule("list", ("mlp_layer_types",)), KindRule("first", ("first_k_dense_replace",), ("dense", "sparse"))),
    editable=("dense",),
)
_LAYER_TYPES = LayerKinds((KindRule("list", ("layer_types",)),), editable=("full_attention",))
_QWEN_HYBRID = LayerKinds(
    (KindRule("list", ("layer_types",)), KindRule("interval", ("full_attention_interval",))),
    editable=("full_attention",),
)


def _nemotron_h_kinds(editable: str) -> LayerKinds:
    """Nemotron-H: one block per layer (state-space, attention, MLP or experts), in either spelling."""
    return LayerKinds(
        (
            KindRule("list", ("layers_block_type",)),
            KindRule(
                "pattern",
                ("hybrid_override_pattern",),
                names=(("M", "linear_attention"), ("E", "moe"), ("*", "full_attention"), ("-", "mlp")),
            ),
        ),
        editable=(editable,),
    )


# Residual writers of the layers' other token mixers: a Mamba block's out_proj, as wide as
# mamba_expand × hidden_size; a gated delta net's (Qwen3-Next and its kin) as its value heads; a short
# convolution's (LFM2) as the hidden size.
_MAMBA_OUT = Mixer("mamba.out_proj", (("mamba_expand", "hidden_size"),))
_DELTA_OUT = Mixer("linear_attn.out_proj", (("linear_num_value_heads", "linear_value_head_dim"),))
_CONV_OUT = Mixer("conv.out_proj", (("hidden_size",),), kinds=("conv",))
# PEFT puts no LoRA on a Mamba out_proj of the families whose fused training kernel reads its weight directly.
_MAMBA_LORA = (
    "PEFT refuses a LoRA on this family's Mamba out_proj (its fused kernel reads the weight directly); "
    "ship the baked checkpoint"
)
