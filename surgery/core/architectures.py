"""The one place that knows where heads and neurons live in each architecture.

Everything else asks this table for tensor and module names. Supporting a new model_type means
adding a row to ``ARCHITECTURES`` below, never a try/except elsewhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from .errors import CheckpointError, UnsupportedArchitecture


@dataclass(frozen=True)
class Layout:
    """Where one architecture keeps the pieces we edit, relative to a decoder layer.

    ``layer_prefixes`` lists every spelling of the decoder-layer prefix met in real checkpoints
    (``{layer}`` is the index). Multimodal wrappers were saved under different prefixes by
    different transformers versions; the spelling that a checkpoint or a loaded model actually
    contains is chosen by :meth:`Architecture.layer_prefix`, never guessed.
    """

    layer_prefixes: tuple[str, ...]
    o_proj: str = "self_attn.o_proj"
    # The attention inputs, checked against the config's head counts before any edit (a config
    # whose heads fit o_proj but not k/v would otherwise only fail inside transformers' loader).
    q_proj: str | None = "self_attn.q_proj"
    k_proj: str | None = "self_attn.k_proj"
    v_proj: str | None = "self_attn.v_proj"
    # Fused q/k/v (Phi-3): one ((heads + 2 kv_heads) × head_dim, H) matrix.
    qkv_proj: str | None = None
    down_proj: str = "mlp.down_proj"
    gate_proj: str | None = "mlp.gate_proj"
    up_proj: str | None = "mlp.up_proj"
    # Fused gate/up (Phi-3): one (2I, H) matrix, gate rows [0:I], up rows [I:2I].
    gate_up_proj: str | None = None
    # The text model's settings live under this key of config.json (multimodal wrappers).
    text_config_key: str | None = None
    # Mixture-of-experts layers (None: every layer is a dense MLP).
    experts: "Experts | None" = None
    # After the decoder layers (a knockout pass resumed at layer L runs the model's tail itself):
    # the final norm, a sibling of the layer list, and the config field of a logit soft-cap.
    final_norm: str = "norm"
    logit_softcap: str | None = None
    # The release's native tensor names (a second copy of the weights some releases ship next to
    # the transformers ones, e.g. Mistral's consolidated.safetensors): see NativeName.
    native_names: tuple["NativeName", ...] = ()
    # Why head edits are refused on this family (None: heads are the o_proj input columns): the
    # attention shapes are then not checked either (the table knows no head layout to check them by).
    head_refusal: str | None = None
    # Modules a release stores under other names than transformers' modules (transformers renames
    # them on load): (in-memory prefix, stored prefix) pairs relative to a layer, e.g.
    # ("mlp.shared_experts.", "mlp.shared_mlp."); a checkpoint may hold either spelling.
    stored_modules: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class NativeName:
    """A tensor name of a release's native format and the transformers name of the same tensor.

    ``pattern`` matches the whole native name; ``loaded`` is its ``re`` replacement (``\\1`` = the
    layer). ``permuted``: the native rows are in another order than transformers' (Mistral and
    Meta store wq/wk for interleaved RoPE; the conversion permutes them), so the same bytes are not
    the same rows and no byte plan may be carried over to it.
    """

    pattern: str
    loaded: str
    permuted: bool = False


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


@dataclass(frozen=True)
class Experts:
    """Where a mixture-of-experts layer keeps its experts, in memory and in both on-disk layouts.

    In memory transformers 5 fuses every expert of a layer into one module (``module``) holding the
    3-D parameters ``gate_up_proj`` and ``down_proj``. On disk a checkpoint holds either one tensor
    per expert (``per_expert``: gate, up, down names relative to the layer, ``{expert}`` the index;
    what Hub releases hold and save_pretrained writes back) or the fused 3-D tensors themselves
    (``module`` + ``.gate_up_proj`` / ``.down_proj``). Fused tensors are [E, 2I, H] and [E, H, I]
    (gate rows [0:I], up rows [I:2I]), or with ``transposed`` [E, H, 2I] and [E, I, H]; with
    ``interleaved`` gate j and up j are entries 2j and 2j+1 (GPT-OSS), and ``gate_up_proj_bias``
    [E, 2I] then follows the same order.
    """

    num_keys: tuple[str, ...]           # config keys for the number of routed experts (first present)
    size_key: str                       # config key of one routed expert's intermediate size
    per_expert: tuple[str, str, str] | None
    module: str = "mlp.experts"
    transposed: bool = False
    interleaved: bool = False
    # A shared expert every token goes through (Qwen2-MoE): a dense MLP with its own width.
    shared: str | None = None
    shared_size_key: str | None = None
    # The shared expert's own matrices, relative to ``shared``: the MLP inputs (whose rows feed a
    # neuron) and the down matrix (whose columns it writes through).
    shared_inputs: tuple[str, ...] = ("gate_proj", "up_proj")
    shared_down: str = "down_proj"
    # Configs that interleave dense MLP layers (Qwen-MoE): the keys that say which layers.
    sparse_step_key: str | None = None
    dense_layers_key: str | None = None
    # --- issue 24 (MoE variants) ---
    # The fused tensors' names in a release's own files where transformers renames them on load
    # (Granite-MoE's block_sparse_moe.input_linear / output_linear): gate_up and down, relative to a
    # layer, with their suffix. The fused in-memory names (a transformers 5 re-save) are read too.
    stored_fused: tuple[str, str] | None = None
    # The shared expert's width is shared_size_key × shared_count_key where the family sizes it by a
    # count of shared experts (DeepSeek: moe_intermediate_size × n_shared_experts); its input is one
    # fused [gate; up] matrix with ``shared_fused`` (Granite's shared_mlp.input_linear).
    shared_count_key: str | None = None
    shared_fused: bool = False
    # Config keys of the width of the dense MLP layers among the expert layers, the first one set
    # (empty: the family has no dense MLP layers).
    dense_size_keys: tuple[str, ...] = ("intermediate_size",)
    # Which layers route, in transformers' order of precedence: a per-layer list of "sparse"/"dense"
    # (``layer_types_key``, what transformers 5 writes), a list of the sparse layers' indices
    # (``sparse_list_key``), else the step rule above restricted to first_dense ≤ layer ≤ last_sparse
    # (``first_dense_key``, ``first_dense_default`` when config.json lacks it, as the config class
    # fills it in; ``last_sparse_key``, -1 = the last layer).
    layer_types_key: str | None = None
    sparse_list_key: str | None = None
    first_dense_key: str | None = None
    first_dense_default: int = 0
    last_sparse_key: str | None = None
    # The step rule's offset: layer % step == offset (Jamba: expert_layer_offset), ``sparse_offset``
    # without the key (-1: (layer + 1) % step == 0, Qwen's rule; 0: DeepSeek's layer % moe_layer_freq == 0).
    sparse_offset_key: str | None = None
    sparse_offset: int = -1
    # config.json spellings transformers reads as the keys above (the config class's attribute_map,
    # alias → key), for configs written before the key was renamed.
    aliases: tuple[tuple[str, str], ...] = ()
    # How the experts module is run: "routed" (transformers' experts interface: the tokens each
    # expert is routed, with the router's weights) or "dense" (Llama 4: every expert runs on every
    # token, its input already scaled by the router's score, exactly 0 off the token's top-k).
    dispatch: str = "routed"


_DECODER = ("model.layers.{layer}.",)
_QWEN_EXPERTS = ("mlp.experts.{expert}.gate_proj", "mlp.experts.{expert}.up_proj",
                 "mlp.experts.{expert}.down_proj")

# Mixtral's per-expert names: w1 = gate, w3 = up, w2 = down.
_MIXTRAL_EXPERTS = ("block_sparse_moe.experts.{expert}.w1", "block_sparse_moe.experts.{expert}.w3",
                    "block_sparse_moe.experts.{expert}.w2")
# Granite-MoE releases store the fused experts under names of their own.
_GRANITE_EXPERTS = Experts(("num_local_experts",), "intermediate_size", None, module="block_sparse_moe.experts",
                           stored_fused=("block_sparse_moe.input_linear.weight",
                                         "block_sparse_moe.output_linear.weight"), dense_size_keys=())
# Llama 4: fused [E, H, 2I] experts on disk too, a shared expert, dense MLPs interleaved (moe_layers).
_LLAMA4_EXPERTS = Experts(("num_local_experts",), "intermediate_size", None, module="feed_forward.experts",
                          transposed=True, shared="feed_forward.shared_expert", shared_size_key="intermediate_size",
                          dense_size_keys=("intermediate_size_mlp",), sparse_list_key="moe_layers",
                          sparse_step_key="interleave_moe_layer_step", dispatch="dense")
_HYBRID = ("hybrid layers (linear-attention or state-space layers beside full attention): per-layer head edits are "
           "not in the table yet; edit its MLP and expert neurons")
# DeepSeek-V3.2 and its kin: a per-layer list of MLP kinds, else the first first_k_dense_replace dense.
_DEEPSEEK_EXPERTS = Experts(("n_routed_experts",), "moe_intermediate_size", _QWEN_EXPERTS, shared="mlp.shared_experts",
                            shared_size_key="moe_intermediate_size", shared_count_key="n_shared_experts",
                            layer_types_key="mlp_layer_types", first_dense_key="first_k_dense_replace",
                            first_dense_default=3, aliases=(("num_local_experts", "n_routed_experts"),))
# config.json spellings of the expert count (the config classes' attribute_map).
_N_LOCAL = (("num_experts", "num_local_experts"),)
_N_EXPERTS = (("num_local_experts", "num_experts"),)
_N_ROUTED = (("num_local_experts", "n_routed_experts"),)
_SARVAM = (("num_experts", "n_routed_experts"), ("num_local_experts", "n_routed_experts"),
           ("num_shared_experts", "n_shared_experts"))
_GRANITE_SHARED = replace(_GRANITE_EXPERTS, shared="shared_mlp", shared_size_key="shared_intermediate_size",
                          shared_inputs=("input_linear",), shared_down="output_linear", shared_fused=True)
_QWEN35_EXPERTS = Experts(("num_experts",), "moe_intermediate_size", _QWEN_EXPERTS, shared="mlp.shared_expert",
                          shared_size_key="shared_expert_intermediate_size", dense_size_keys=())
_KIMI_EXPERTS = Experts(("num_experts",), "moe_intermediate_size", _QWEN_EXPERTS, shared="mlp.shared_experts",
                        shared_size_key="moe_intermediate_size", shared_count_key="num_shared_experts",
                        layer_types_key="mlp_layer_types", first_dense_key="first_k_dense_replace",
                        aliases=(("num_local_experts", "num_experts"), ("n_shared_experts", "num_shared_experts")))
_MLA = ("multi-head latent attention (o_proj input = heads × v_head_dim, low-rank q/kv): head edits on MLA "
        "are not in the table yet; edit its MLP and expert neurons")

ARCHITECTURES: dict[str, Layout] = {
    "llama": Layout(_DECODER, native_names=_META_NATIVE),
    "mistral": Layout(_DECODER, native_names=_META_NATIVE),
    "qwen2": Layout(_DECODER),
    "qwen3": Layout(_DECODER),
    "gemma": Layout(_DECODER),
    "gemma2": Layout(_DECODER, logit_softcap="final_logit_softcapping"),
    "gemma3_text": Layout(_DECODER, logit_softcap="final_logit_softcapping"),
    "gemma3": Layout(
        ("model.language_model.layers.{layer}.", "language_model.model.layers.{layer}."),
        text_config_key="text_config",  # its forward applies no soft-cap (transformers 5.24)
    ),
    "phi3": Layout(_DECODER, gate_proj=None, up_proj=None, gate_up_proj="mlp.gate_up_proj",
                   q_proj=None, k_proj=None, v_proj=None, qkv_proj="self_attn.qkv_proj"),
    "olmo2": Layout(_DECODER),
    "mixtral": Layout(_DECODER, experts=Experts(("num_local_experts",), "intermediate_size", _MIXTRAL_EXPERTS,
                                                aliases=_N_LOCAL)),
    "qwen2_moe": Layout(_DECODER, experts=Experts(
        ("num_experts", "num_local_experts"), "moe_intermediate_size", _QWEN_EXPERTS,
        shared="mlp.shared_expert", shared_size_key="shared_expert_intermediate_size",
        sparse_step_key="decoder_sparse_step", dense_layers_key="mlp_only_layers")),
    "qwen3_moe": Layout(_DECODER, experts=Experts(
        ("num_experts", "num_local_experts"), "moe_intermediate_size", _QWEN_EXPERTS,
        sparse_step_key="decoder_sparse_step", dense_layers_key="mlp_only_layers")),
    "olmoe": Layout(_DECODER, experts=Experts(("num_experts",), "intermediate_size", _QWEN_EXPERTS,
                                              aliases=_N_EXPERTS)),
    "gpt_oss": Layout(_DECODER, experts=Experts(
        ("num_local_experts",), "intermediate_size", None, transposed=True, interleaved=True, aliases=_N_LOCAL)),

    # --- MoE variants (issue 24) ---
    # Per-expert names on disk are what transformers' checkpoint conversion mapping splits the fused
    # experts into; config aliases are the config class's attribute_map (tests/core/test_moe_table.py
    # compares every row with both, and its routing rule and sizes with the model transformers builds).
    "deepseek_v2": Layout(_DECODER, head_refusal=_MLA, experts=replace(
        _DEEPSEEK_EXPERTS, layer_types_key=None, first_dense_default=0,
        aliases=(("num_experts", "n_routed_experts"),))),
    "deepseek_v3": Layout(_DECODER, head_refusal=_MLA, experts=replace(_DEEPSEEK_EXPERTS, layer_types_key=None)),
    "deepseek_v32": Layout(_DECODER, head_refusal=_MLA, experts=_DEEPSEEK_EXPERTS),
    "glm_moe_dsa": Layout(_DECODER, head_refusal=_MLA, experts=_DEEPSEEK_EXPERTS),
    "glm4_moe": Layout(_DECODER, experts=replace(_DEEPSEEK_EXPERTS, layer_types_key=None, first_dense_default=1)),
    "glm4_moe_lite": Layout(_DECODER, head_refusal=_MLA, experts=replace(
        _DEEPSEEK_EXPERTS, first_dense_key=None, first_dense_default=1)),
    "sarvam_mla": Layout(_DECODER, head_refusal=_MLA, experts=replace(
        _DEEPSEEK_EXPERTS, layer_types_key=None, first_dense_default=1, aliases=_SARVAM)),
    "axk1": Layout(_DECODER, head_refusal=_MLA, experts=replace(
        _DEEPSEEK_EXPERTS, first_dense_default=1, sparse_step_key="moe_layer_freq", sparse_offset=0)),
    "axk2": Layout(_DECODER, head_refusal=_MLA, experts=replace(
        _DEEPSEEK_EXPERTS, first_dense_default=1, sparse_step_key="moe_layer_freq", sparse_offset=0)),
    "dots1": Layout(_DECODER, experts=replace(_DEEPSEEK_EXPERTS, layer_types_key=None, first_dense_default=0)),
    "solar_open": Layout(_DECODER, experts=replace(_DEEPSEEK_EXPERTS, layer_types_key=None, first_dense_key=None,
                                                   first_dense_default=0, dense_size_keys=())),
    # Sarvam-MoE releases store Bailing-style attention: attention.dense (o_proj), one fused query_key_value.
    "sarvam_moe": Layout(_DECODER, q_proj=None, k_proj=None, v_proj=None,
                         stored_modules=(("self_attn.o_proj.", "attention.dense."),),
                         experts=replace(_DEEPSEEK_EXPERTS, layer_types_key=None, first_dense_default=1,
                                         aliases=_SARVAM)),
    "ernie4_5_moe": Layout(_DECODER, experts=Experts(
        ("moe_num_experts",), "moe_intermediate_size", _QWEN_EXPERTS, shared="mlp.shared_experts",
        shared_size_key="moe_intermediate_size", shared_count_key="moe_num_shared_experts",
        sparse_step_key="moe_layer_interval", first_dense_key="moe_layer_start_index", first_dense_default=1,
        last_sparse_key="moe_layer_end_index", aliases=(("num_experts", "moe_num_experts"),))),
    "hunyuan_v1_moe": Layout(_DECODER, experts=Experts(
        ("num_experts",), "intermediate_size", _QWEN_EXPERTS, shared="mlp.shared_mlp",
        shared_size_key="intermediate_size", dense_size_keys=(), aliases=_N_EXPERTS)),
    "hy_v3": Layout(_DECODER, stored_modules=(("mlp.shared_experts.", "mlp.shared_mlp."),), experts=Experts(
        ("num_experts",), "moe_intermediate_size", _QWEN_EXPERTS, shared="mlp.shared_experts",
        shared_size_key="moe_intermediate_size", shared_count_key="num_shared_experts",
        layer_types_key="mlp_layer_types", first_dense_default=1, aliases=_N_EXPERTS)),
    "minimax_m2": Layout(_DECODER, experts=Experts(("num_local_experts",), "intermediate_size", _MIXTRAL_EXPERTS,
                                                   dense_size_keys=(), aliases=_N_LOCAL)),
    "phimoe": Layout(_DECODER, experts=Experts(("num_local_experts",), "intermediate_size", _MIXTRAL_EXPERTS,
                                               dense_size_keys=())),
    "granitemoe": Layout(_DECODER, experts=_GRANITE_EXPERTS),
    "granitemoe_swa": Layout(_DECODER, experts=replace(_GRANITE_EXPERTS, stored_fused=None)),
    "granitemoeshared": Layout(_DECODER, experts=_GRANITE_SHARED),
    "flex_olmo": Layout(_DECODER, experts=Experts(("num_experts",), "intermediate_size", _QWEN_EXPERTS,
                                                  dense_size_keys=(), aliases=_N_EXPERTS)),
    "aria_text": Layout(_DECODER, experts=Experts(
        ("moe_num_experts",), "intermediate_size", None, transposed=True,
        stored_fused=("mlp.experts.fc1.weight", "mlp.experts.fc2.weight"), shared="mlp.shared_experts",
        shared_size_key="intermediate_size", shared_count_key="moe_num_shared_experts", dense_size_keys=())),
    "cohere2_moe": Layout(_DECODER, experts=Experts(
        ("num_experts",), "intermediate_size", _QWEN_EXPERTS, shared="mlp.shared_experts",
        shared_size_key="intermediate_size", shared_count_key="num_shared_experts",
        dense_size_keys=("prefix_dense_intermediate_size", "intermediate_size"), layer_types_key="mlp_layer_types")),
    "mellum": Layout(_DECODER, experts=Experts(
        ("num_local_experts",), "moe_intermediate_size", _QWEN_EXPERTS, layer_types_key="mlp_layer_types",
        aliases=_N_LOCAL)),
    "afmoe": Layout(_DECODER, experts=Experts(
        ("num_experts",), "moe_intermediate_size", _QWEN_EXPERTS, shared="mlp.shared_experts",
        shared_size_key="moe_intermediate_size", shared_count_key="num_shared_experts",
        first_dense_key="num_dense_layers", first_dense_default=1)),
    "exaone_moe": Layout(_DECODER, experts=Experts(
        ("num_experts",), "moe_intermediate_size", _QWEN_EXPERTS, shared="mlp.shared_experts",
        shared_size_key="moe_intermediate_size", shared_count_key="num_shared_experts",
        layer_types_key="mlp_layer_types", first_dense_key="first_k_dense_replace", first_dense_default=1)),
    "kolibri1": Layout(_DECODER, experts=Experts(
        ("num_local_experts",), "moe_intermediate_size", _QWEN_EXPERTS, shared="mlp.shared_experts",
        shared_size_key="shared_expert_intermediate_size", dense_size_keys=(), aliases=_N_LOCAL)),
    "beam": Layout(_DECODER, experts=Experts(
        ("num_experts",), "moe_intermediate_size", _QWEN_EXPERTS, layer_types_key="mlp_layer_types",
        first_dense_default=3)),
    "flint": Layout(_DECODER, experts=Experts(
        ("num_experts",), "moe_intermediate_size", _QWEN_EXPERTS, shared="mlp.shared_expert",
        shared_size_key="shared_expert_intermediate_size", sparse_step_key="decoder_sparse_step",
        dense_layers_key="mlp_only_layers")),
    "laguna": Layout(_DECODER, head_refusal=(
        "attention heads differ per layer (num_attention_heads_per_layer) and are gated per head: head edits on "
        "laguna are not in the table yet; edit its MLP and expert neurons"),
        stored_modules=(("mlp.shared_experts.", "mlp.shared_expert."),), experts=Experts(
            ("num_experts",), "moe_intermediate_size", _QWEN_EXPERTS, shared="mlp.shared_experts",
            shared_size_key="shared_expert_intermediate_size", layer_types_key="mlp_layer_types",
            first_dense_default=1)),
    "mimo_v2_flash": Layout(_DECODER, head_refusal=(
        "value heads are v_head_dim wide, not head_dim (o_proj input = heads × v_head_dim): head edits on "
        "mimo_v2_flash are not in the table yet; edit its MLP and expert neurons"), experts=Experts(
            ("n_routed_experts",), "moe_intermediate_size", _QWEN_EXPERTS, layer_types_key="mlp_layer_types",
            first_dense_default=1, aliases=_N_ROUTED)),
    # MiniMax-M3: the dense MLPs and the shared expert hold one fused [gate; up] matrix.
    "minimax_m3_vl_text": Layout(_DECODER, gate_proj=None, up_proj=None, gate_up_proj="mlp.gate_up_proj",
                                 experts=Experts(
        ("num_local_experts",), "intermediate_size", None, shared="mlp.shared_experts",
        shared_size_key="shared_intermediate_size", shared_inputs=("gate_up_proj",), shared_fused=True,
        dense_size_keys=("dense_intermediate_size",), layer_types_key="mlp_layer_types", aliases=_N_LOCAL)),
    # ZAYA: q/k through convolutions, v from two projections; its heads meet in o_proj as usual.
    "zaya": Layout(_DECODER, q_proj="self_attn.qkv_proj.q_proj", k_proj="self_attn.qkv_proj.k_proj", v_proj=None,
                   experts=Experts(("num_experts",), "moe_intermediate_size", None, dense_size_keys=())),
    "llama4_text": Layout(_DECODER, gate_proj="feed_forward.gate_proj", up_proj="feed_forward.up_proj",
                          down_proj="feed_forward.down_proj", experts=_LLAMA4_EXPERTS),
    # Llama 4's releases hold the vision model too (Llama4ForConditionalGeneration); AutoModelForCausalLM
    # loads the text model alone, under model.layers.
    "llama4": Layout(("language_model.model.layers.{layer}.", "model.layers.{layer}."), text_config_key="text_config",
                     gate_proj="feed_forward.gate_proj", up_proj="feed_forward.up_proj",
                     down_proj="feed_forward.down_proj", experts=_LLAMA4_EXPERTS),
    # Hybrids: linear-attention or state-space layers beside full attention.
    "qwen3_next": Layout(_DECODER, head_refusal=_HYBRID, experts=Experts(
        ("num_experts",), "moe_intermediate_size", _QWEN_EXPERTS, shared="mlp.shared_expert",
        shared_size_key="shared_expert_intermediate_size", sparse_step_key="decoder_sparse_step",
        dense_layers_key="mlp_only_layers")),
    "qwen3_5_moe_text": Layout(_DECODER, head_refusal=_HYBRID, experts=_QWEN35_EXPERTS),
    "qwen3_5_moe": Layout(("model.language_model.layers.{layer}.", "model.layers.{layer}."), head_refusal=_HYBRID,
                          text_config_key="text_config", experts=_QWEN35_EXPERTS),
    "qwen4_exp_text": Layout(_DECODER, head_refusal=_HYBRID, experts=_QWEN35_EXPERTS),
    "qwen4_exp": Layout(("model.language_model.layers.{layer}.", "model.layers.{layer}."), head_refusal=_HYBRID,
                        text_config_key="text_config", experts=_QWEN35_EXPERTS),
    "lara_mini": Layout(_DECODER, head_refusal=_HYBRID, experts=replace(_QWEN35_EXPERTS, per_expert=None)),
    "minimax": Layout(_DECODER, head_refusal=_HYBRID, experts=Experts(
        ("num_local_experts",), "intermediate_size", _MIXTRAL_EXPERTS, dense_size_keys=(), aliases=_N_LOCAL)),
    "granitemoehybrid": Layout(_DECODER, head_refusal=_HYBRID, experts=_GRANITE_SHARED),
    "jamba": Layout(_DECODER, head_refusal=_HYBRID, gate_proj="feed_forward.gate_proj",
                    up_proj="feed_forward.up_proj", down_proj="feed_forward.down_proj", experts=Experts(
        ("num_experts",), "intermediate_size", tuple(n.replace("mlp.", "feed_forward.") for n in _QWEN_EXPERTS),
        module="feed_forward.experts", sparse_step_key="expert_layer_period",
        sparse_offset_key="expert_layer_offset", aliases=_N_EXPERTS)),
    # Kimi-Linear and Bailing-hybrid name their keys Kimi's way; Kimi's releases keep the MLP under
    # block_sparse_moe (dense layers too), experts Mixtral-style.
    "kimi_linear": Layout(_DECODER, head_refusal=_HYBRID, stored_modules=(("mlp.", "block_sparse_moe."),),
                          experts=replace(_KIMI_EXPERTS, per_expert=_MIXTRAL_EXPERTS, first_dense_default=1)),
    "bailing_hybrid": Layout(_DECODER, head_refusal=_HYBRID, experts=replace(_KIMI_EXPERTS, first_dense_default=2)),
    "lfm2_moe": Layout(_DECODER, head_refusal=_HYBRID, gate_proj="feed_forward.w1", up_proj="feed_forward.w3",
                       down_proj="feed_forward.w2", experts=Experts(
        ("num_experts",), "moe_intermediate_size",
        tuple(f"feed_forward.experts.{{expert}}.{w}" for w in ("w1", "w3", "w2")), module="feed_forward.experts",
        first_dense_key="num_dense_layers", first_dense_default=2)),
}

TABLE_LOCATION = "surgery/core/architectures.py (the ARCHITECTURES table)"

# Causal-LM families of transformers that surgery refuses, and why (one line each).
REFUSALS: dict[str, str] = {
    # --- MoE variants (issue 24) ---
    "dbrx": ("its experts are DBRX's own GLU (w1/v1/w2 stacked [E·I, H]) run by a custom forward, and its "
             "attention is one fused Wqkv under transformer.blocks: neither is in the table yet"),
    "jetmoe": ("its attention is itself a mixture of experts (MoA: each token's heads come from routed expert "
               "projections), so no fixed columns carry a head; its MLP experts run a custom dispatch"),
    "longcat_flash": ("each layer has two attention blocks, two dense MLPs and zero-computation experts "
                      "(self_attn.0/1, mlps.0/1): a layer's neurons and heads have no single site to name"),
    "dots3_note": "the number of routed experts differs per layer (pyramid_num_routed); the table has one per model",
    "dots3_note_text": ("the number of routed experts differs per layer (pyramid_num_routed); the table has one "
                        "per model"),
    "inkling_text": ("short convolutions wrap its attention inputs and its experts (attn_sconv, k/v_sconv, "
                     "mlp_sconv): not described by the table yet"),
    "inkling2_text": ("its attention projections are wrapped in short convolutions and its layers read "
                      "learned residual queries (attention_input, mlp_input): not described by the table yet"),
    "inkling2_loop_text": ("a looped Inkling-2 (layers re-run with message gates between passes): one weight "
                           "serves several passes, so an edit's site is not one layer"),
}


@dataclass(frozen=True)
class Geometry:
    """Sizes read from the config: what layer/head/neuron indices may be."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    # Mixture of experts (0 / empty for dense models): routed experts per layer, one expert's
    # width, the shared expert's width, and the layers that route (the others are dense MLPs).
    num_experts: int = 0
    expert_size: int = 0
    shared_size: int = 0
    sparse_layers: frozenset[int] = frozenset()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; a dense model's dict has only the dense fields (findings written before MoE
        support record exactly those, and must still match)."""
        out = {k: v for k, v in self.__dict__.items() if k not in _MOE_FIELDS}
        if self.num_experts:
            out.update(num_experts=self.num_experts, expert_size=self.expert_size,
                       shared_size=self.shared_size, sparse_layers=sorted(self.sparse_layers))
        return out


_MOE_FIELDS = ("num_experts", "expert_size", "shared_size", "sparse_layers")


@dataclass(frozen=True)
class Architecture:
    """A supported model: its layout and its geometry."""

    model_type: str
    layout: Layout
    geometry: Geometry

    def layer_prefix(self, names: Iterable[str]) -> str:
        """The layer-prefix template that ``names`` (tensor or module names) use.

        Exactly one spelling of the table must occur; anything else is a clear error.
        """
        names = list(names)
        found = [
            p for p in self.layout.layer_prefixes
            if any(n.startswith(p.format(layer=0)) for n in names)
        ]
        if len(found) != 1:
            raise UnsupportedArchitecture(
                f"{self.model_type}: expected decoder layers under one of "
                f"{', '.join(p.format(layer='N') for p in self.layout.layer_prefixes)}, "
                f"found {'none' if not found else 'several'}; extend {TABLE_LOCATION}"
            )
        return found[0]

    def loaded_name(self, native: str) -> tuple[str, bool] | None:
        """The transformers name of a tensor stored under a native name (see ``NativeName``), and
        whether its rows are permuted; None when the table knows no such name."""
        for entry in self.layout.native_names:
            if match := re.fullmatch(entry.pattern, native):
                return match.expand(entry.loaded), entry.permuted
        return None

    def release_name(self, module: str) -> str:
        """``module`` (an in-memory name relative to a layer) as the family's releases store it
        (``Layout.stored_modules``; itself where they keep transformers' name)."""
        for memory, release in self.layout.stored_modules:
            if f"{module}.".startswith(memory):
                return (release + f"{module}."[len(memory):])[:-1]
        return module

    def is_sparse(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is a mixture of experts."""
        return layer in self.geometry.sparse_layers

    def fused_experts(self, names: Iterable[str]) -> bool:
        """Whether ``names`` (a checkpoint's tensors) hold the experts fused (3-D) or one per expert."""
        return self.stored_experts(names) is not None

    def stored_experts(self, names: Iterable[str]) -> tuple[str, str] | None:
        """The fused (gate_up, down) tensors of ``names`` (a checkpoint's tensors) relative to a
        layer, under the in-memory names or a release's own (``Experts.stored_fused``); None when
        the checkpoint holds one tensor per expert.

        Decided from the names of the first sparse layer; quantized experts (GPT-OSS's MXFP4
        ``_blocks``/``_scales``) and anything else are one clear line.
        """
        ex = self.layout.experts
        names = set(names)
        layer = min(self.geometry.sparse_layers)
        prefix = self.layer_prefix(names).format(layer=layer)
        in_memory = (f"{ex.module}.gate_up_proj", f"{ex.module}.down_proj")
        if f"{prefix}{in_memory[0]}_blocks" in names:
            raise CheckpointError(f"{self.model_type}: the experts are quantized ('{prefix}{in_memory[0]}_blocks', "
                                  "MXFP4); surgery edits F32, F16 and BF16 weights only: use a dequantized (bf16) copy")
        for fused in filter(None, (in_memory, ex.stored_fused)):
            if f"{prefix}{fused[0]}" in names:
                return fused
        if ex.per_expert and f"{prefix}{ex.per_expert[0].format(expert=0)}.weight" in names:
            return None
        spelled = [f"{prefix}{fused[0]}" for fused in filter(None, (in_memory, ex.stored_fused))]
        spelled += [f"{prefix}{ex.per_expert[0].format(expert=0)}.weight"] if ex.per_expert else []
        raise UnsupportedArchitecture(f"{self.model_type}: layer {layer} has no expert tensors (looked for "
                                      f"{' or '.join(spelled)}); extend {TABLE_LOCATION}")

    def expert_slices(self, expert: int, part: str, fused: bool, stored: tuple[str, str] | None = None
                      ) -> list[tuple[str, tuple[int, ...], int, int, bool]]:
        """Where a per-expert matrix ``part`` ("gate", "up", "down"; standard [out, in] orientation)
        of ``expert`` lies on disk, as (tensor relative to the layer, its full shape, first row and
        number of rows of the expert's window in the tensor viewed as 2-D [rows, last dim], and
        ``flipped``: the matrix's rows are the window's columns and vice versa). A fused gate/up
        window holds both halves: :meth:`expert_rows` says which of its rows (columns) are a neuron's.
        ``stored``: the fused tensors' names (:meth:`stored_experts`; default the in-memory ones).
        """
        ex, g = self.layout.experts, self.geometry
        E, H, I = g.num_experts, g.hidden_size, g.expert_size
        if not fused:
            name = ex.per_expert[("gate", "up", "down").index(part)].format(expert=expert) + ".weight"
            shape = (H, I) if part == "down" else (I, H)
            return [(name, shape, 0, shape[0], False)]
        gate_up, down = stored or (f"{ex.module}.gate_up_proj", f"{ex.module}.down_proj")
        if part == "down":
            shape = (E, I, H) if ex.transposed else (E, H, I)
            return [(down, shape, expert * shape[1], shape[1], ex.transposed)]
        shape = (E, H, 2 * I) if ex.transposed else (E, 2 * I, H)
        out = [(gate_up, shape, expert * shape[1], shape[1], ex.transposed)]
        if ex.interleaved:  # GPT-OSS: the gate/up bias [E, 2I] is pruned with the rows
            out.append((f"{gate_up}_bias", (E, 2 * I), expert, 1, True))
        return out

    def expert_rows(self, part: str, neuron: int, fused: bool) -> tuple[int, ...]:
        """The rows (of a gate/up matrix in [out, in] orientation) that belong to ``neuron``."""
        if not fused or part == "down":
            return (neuron,)
        ex, I = self.layout.experts, self.geometry.expert_size
        if ex.interleaved:
            return (2 * neuron + (part == "up"),)
        return (neuron + (I if part == "up" else 0),)

    def mlp_input_modules(self) -> tuple[str, ...]:
        """Names (relative to a layer) of the matrices whose rows feed the MLP neurons."""
        lay = self.layout
        if lay.gate_up_proj:
            return (lay.gate_up_proj,)
        return tuple(m for m in (lay.gate_proj, lay.up_proj) if m)

    def neuron_rows(self, module: str, neuron: int) -> tuple[int, ...]:
        """Rows of ``module`` (an MLP input matrix) that belong to ``neuron``."""
        if module == self.layout.gate_up_proj:
            return (neuron, self.geometry.intermediate_size + neuron)
        return (neuron,)

    def shared_rows(self, neuron: int) -> tuple[int, ...]:
        """Rows of each shared-expert input matrix that belong to ``neuron`` (a fused [gate; up]
        input holds two: ``Experts.shared_fused``)."""
        ex, S = self.layout.experts, self.geometry.shared_size
        return (neuron, S + neuron) if ex.shared_fused else (neuron,)

    def shared_input_shape(self) -> tuple[int, int]:
        """The weight shape of each shared-expert input matrix: (S, H), or (2S, H) fused."""
        g = self.geometry
        return ((2 if self.layout.experts.shared_fused else 1) * g.shared_size, g.hidden_size)

    def mlp_shapes(self) -> dict[str, tuple[int, int]]:
        """Expected weight shape of each MLP matrix (relative to a layer): down_proj (H, I), the
        gate/up inputs (I, H), a fused gate_up (2I, H)."""
        g, lay = self.geometry, self.layout
        shapes = {lay.down_proj: (g.hidden_size, g.intermediate_size)}
        for module in self.mlp_input_modules():
            width = 2 * g.intermediate_size if module == lay.gate_up_proj else g.intermediate_size
            shapes[module] = (width, g.hidden_size)
        return shapes

    def attention_shapes(self) -> dict[str, tuple[tuple[int, int], str]]:
        """Expected weight shape of each attention matrix (relative to a layer), with the config
        fields that set its head dimension, as ``name → ((rows, cols), "fields = sizes")``."""
        g, lay = self.geometry, self.layout
        if lay.head_refusal:  # no head edits: the table knows no head layout to check the shapes by
            return {}
        q_rows, kv_rows = g.num_heads * g.head_dim, g.num_kv_heads * g.head_dim
        q = f"num_attention_heads × head_dim = {g.num_heads} × {g.head_dim}"
        kv = f"num_key_value_heads × head_dim = {g.num_kv_heads} × {g.head_dim}"
        shapes = {lay.o_proj: ((g.hidden_size, q_rows), f"{q} columns")}
        if lay.q_proj:
            shapes[lay.q_proj] = ((q_rows, g.hidden_size), f"{q} rows")
        for name in (lay.k_proj, lay.v_proj):
            if name:
                shapes[name] = ((kv_rows, g.hidden_size), f"{kv} rows")
        if lay.qkv_proj:
            shapes[lay.qkv_proj] = ((q_rows + 2 * kv_rows, g.hidden_size),
                                    f"(num_attention_heads + 2 × num_key_value_heads) × head_dim = "
                                    f"({g.num_heads} + 2 × {g.num_kv_heads}) × {g.head_dim} rows")
        return shapes

    def head_columns(self, head: int) -> slice:
        """Columns of o_proj (its input features) that carry ``head``'s output."""
        d = self.geometry.head_dim
        return slice(head * d, (head + 1) * d)


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The text-model part of a config dict (the dict itself for plain causal LMs)."""
    layout = ARCHITECTURES.get(str(config.get("model_type")))
    if layout and layout.text_config_key:
        return config.get(layout.text_config_key) or {}
    return config


def _geometry(model_type: str, cfg: Mapping[str, Any]) -> Geometry:
    def need(key: str) -> int:
        if not isinstance(cfg.get(key), int):
            raise UnsupportedArchitecture(
                f"config.json of this {model_type} model has no integer '{key}'; "
                "is it a complete transformers config?"
            )
        return int(cfg[key])

    heads = need("num_attention_heads")
    hidden = need("hidden_size")
    layers = need("num_hidden_layers")
    # head_dim is explicit in Gemma/Qwen3 configs and differs from hidden/heads there.
    head_dim = cfg.get("head_dim") or hidden // heads
    ex = ARCHITECTURES[model_type].experts
    if ex and ex.aliases:  # an old spelling stands for the key when the key itself is absent
        cfg = {**{key: cfg[alias] for alias, key in ex.aliases if alias in cfg}, **cfg}
    keys = ex.dense_size_keys if ex else ("intermediate_size",)
    dense_key = next((k for k in keys if cfg.get(k) is not None), keys[0]) if keys else None
    dense = Geometry(layers, heads, int(cfg.get("num_key_value_heads") or heads), int(head_dim), hidden,
                     need(dense_key) if dense_key else 0)
    if ex is None:
        return dense
    num = next((k for k in ex.num_keys if cfg.get(k) is not None), ex.num_keys[0])
    shared = need(ex.shared_size_key) if ex.shared_size_key else 0
    if ex.shared_count_key:
        shared *= need(ex.shared_count_key)
    sparse = _sparse_layers(model_type, ex, cfg, layers) if need(num) > 0 else frozenset()
    if sparse and len(sparse) < layers and not dense_key:
        raise UnsupportedArchitecture(f"config.json of this {model_type} model makes layers "
                                      f"{sorted(set(range(layers)) - sparse)} dense, but {model_type} has no dense "
                                      "MLP layers; is it a complete transformers config?")
    return replace(dense, num_experts=need(num), expert_size=need(ex.size_key), shared_size=shared,
                   sparse_layers=sparse)


def _sparse_layers(model_type: str, ex: Experts, cfg: Mapping[str, Any], layers: int) -> frozenset[int]:
    """The layers whose MLP is a mixture of experts, by the config's keys (see ``Experts``)."""
    kinds = cfg.get(ex.layer_types_key) if ex.layer_types_key else None
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) != layers:
            raise UnsupportedArchitecture(
                f"config.json of this {model_type} model has '{ex.layer_types_key}' = {kinds!r:.60}, not a list of "
                f"num_hidden_layers = {layers} layer kinds; correct it or drop it")
        return frozenset(i for i, kind in enumerate(kinds) if kind == "sparse")
    listed = cfg.get(ex.sparse_list_key) if ex.sparse_list_key else None
    if listed is not None:
        if not isinstance(listed, list) or not all(isinstance(i, int) and 0 <= i < layers for i in listed):
            raise UnsupportedArchitecture(
                f"config.json of this {model_type} model has '{ex.sparse_list_key}' = {listed!r:.60}, not a list of "
                f"layer indices in 0..{layers - 1}; correct it or drop it")
        return frozenset(listed)
    step = int(cfg.get(ex.sparse_step_key) or 1) if ex.sparse_step_key else 1
    only_dense = set(cfg.get(ex.dense_layers_key) or []) if ex.dense_layers_key else set()
    first = ex.first_dense_default
    if ex.first_dense_key and cfg.get(ex.first_dense_key) is not None:
        first = int(cfg[ex.first_dense_key])
    last = int(cfg.get(ex.last_sparse_key, -1)) if ex.last_sparse_key else -1
    last = layers - 1 if last == -1 else last
    # transformers' rule (Qwen-MoE): experts where layer ∉ mlp_only_layers and (layer+1) % step == 0.
    offset = int(cfg.get(ex.sparse_offset_key) or 0) if ex.sparse_offset_key else ex.sparse_offset
    return frozenset(i for i in range(layers)
                     if first <= i <= last and i not in only_dense and i % step == offset % step)


def architecture(config: Mapping[str, Any]) -> Architecture:
    """Look up a config dict (config.json) in the table."""
    model_type = config.get("model_type")
    layout = ARCHITECTURES.get(str(model_type))
    if layout is None and str(model_type) in REFUSALS:
        raise UnsupportedArchitecture(f"model_type '{model_type}' is not supported: {REFUSALS[str(model_type)]}")
    if layout is None:
        raise UnsupportedArchitecture(
            f"model_type '{model_type}' is not supported (supported: "
            f"{', '.join(sorted(ARCHITECTURES))}); to add it, extend {TABLE_LOCATION}"
        )
    return Architecture(str(model_type), layout, _geometry(str(model_type), text_config(config)))
