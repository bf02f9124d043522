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
    # The token embedding table [vocab, hidden], a sibling of the layer list like the final norm.
    embeddings: str = "embed_tokens"
    logit_softcap: str | None = None
    # The release's native tensor names (a second copy of the weights some releases ship next to
    # the transformers ones, e.g. Mistral's consolidated.safetensors): see NativeName.
    native_names: tuple["NativeName", ...] = ()
    # --- issue 24 (MLA, hybrid layers, DeepSeek-V4): see the section of that name below ---
    # Multi-head latent attention: o_proj's input is num_heads × v_head_dim; q/kv through low-rank pairs.
    mla: "Mla | None" = None
    # DeepSeek-V4's grouped low-rank output: a head is a block of o_proj (= o_a_proj) within its group's rows.
    grouped_output: "GroupedOutput | None" = None
    # Hybrid models: which layers have attention heads at o_proj (the others: linear attention,
    # state-space, convolution…), and which have a dense MLP; None: every layer has both.
    layer_kinds: "LayerKinds | None" = None
    mlp_kinds: "LayerKinds | None" = None
    # Gated attention (Qwen3-Next, Qwen3.5): q_proj's rows hold each head's query and its output gate.
    q_gate: bool = False
    # Modules (relative to a layer) stored on disk under another name than the loaded model's, as
    # transformers' checkpoint conversion mapping renames them: (loaded, stored) name prefixes, e.g.
    # DeepSeek-V4's ("self_attn.o_a_proj", "attn.wo_a"), Ling's ("self_attn.", "attention.").
    stored_names: tuple[tuple[str, str], ...] = ()
    # An MLP whose width the model derives from intermediate_size (LFM2, as Meta's Llama code did): the
    # config keys of (the switch, the multiplier, the multiple): width = 2·I/3, × multiplier, rounded up.
    ffn_adjust: tuple[str, str, str] | None = None
    # An MLP narrower than intermediate_size by this factor (RecurrentGemma's is intermediate_size // 2).
    ffn_divisor: int = 1
    # find-heads' passes: whether the model's cache is one key/value pair per layer and nothing else
    # (shared prefixes and resumed passes slice it; a state-space, compressed or indexer cache is not),
    # and a module the model applies before its final norm (the hyper-connection head that merges
    # DeepSeek-V4's residual streams).
    kv_cache: bool = True
    final_head: str | None = None
    # The config attribute the last hidden states are divided by before lm_head (MiniCPM3's logits_scaling).
    logit_scaling: str | None = None
    # Whether attention reads the prompt's tokens as its keys and nothing else (DeepSeek-V4 also reads
    # compressed blocks of them): find-heads' per-token binding features and edge knockouts need it.
    token_keys: bool = True


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


# --- MLA, DeepSeek-V4's grouped output, hybrid layer kinds (issue 24): the shapes of the rows below ---

@dataclass(frozen=True)
class Mla:
    """Multi-head latent attention (DeepSeek-V2/V3 and the families built on them), relative to a layer.

    Queries come from ``q_proj`` or, where the config sets ``q_lora_rank``, the low-rank pair
    ``q_a_proj`` → ``q_b_proj`` (num_heads × (qk_nope_head_dim + qk_rope_head_dim) rows); keys and values
    from one compressed latent, ``kv_a_proj`` (kv_lora_rank + qk_rope_head_dim rows) → ``kv_b_proj``
    (num_heads × (qk_nope_head_dim + v_head_dim) rows). o_proj's input is num_heads × v_head_dim, head
    after head, so a head is its v_head_dim columns of o_proj as in any attention: q·k and v head sizes
    differ, the output side does not care. A name set to None is a part the variant computes otherwise
    (it is then not shape-checked).
    """

    q_proj: str | None = "self_attn.q_proj"
    q_a_proj: str | None = "self_attn.q_a_proj"
    q_b_proj: str | None = "self_attn.q_b_proj"
    kv_a_proj: str = "self_attn.kv_a_proj_with_mqa"
    kv_b_proj: str = "self_attn.kv_b_proj"


@dataclass(frozen=True)
class MlaSizes:
    """An MLA config's sizes, read from its keys of the same names (``q_lora_rank`` None: plain q_proj)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class GroupedOutput:
    """DeepSeek-V4's grouped low-rank output projection; ``Layout.o_proj`` names its first half, o_a_proj.

    The heads' outputs (num_heads × head_dim, head after head) are split into ``o_groups`` groups of
    consecutive heads. o_a_proj is block-diagonal, stored as one (o_groups × o_lora_rank,
    num_heads × head_dim / o_groups) matrix: group g's rows [g·R, (g+1)·R) read group g's inputs only,
    and o_b_proj mixes the groups' outputs. So head h is the head_dim columns of its place in group
    h // (heads per group), within that group's rows: scaling them scales exactly the head's output
    (the run-time twin scales that group's slice of o_a_proj's input).
    """

    o_b_proj: str = "self_attn.o_b_proj"
    kv_proj: str = "self_attn.kv_proj"


@dataclass(frozen=True)
class KindRule:
    """One way config.json says what kind each decoder layer is, as transformers' config class reads
    it into ``layer_types`` / ``mlp_layer_types`` (tests compare the two). ``form``:

    * "list": ``keys[0]`` holds one kind per layer (older spellings renamed by :data:`LEGACY_KINDS`
      and ``names``); "cycle": the same, repeated to the number of layers (RecurrentGemma);
    * "interval": layer i is ``kinds[0]`` where (i + 1) % n == 0 (Qwen3-Next's full_attention_interval);
    * "period": layer i is ``kinds[0]`` where i % period == offset (Jamba; ``keys`` = period, offset);
    * "indices": the listed layers are ``kinds[0]`` (``one_based``: counted from 1; null: none);
    * "first": the first k layers are ``kinds[0]`` (DeepSeek's first_k_dense_replace);
    * "pattern": one character per layer, renamed by ``names`` (Nemotron-H's hybrid_override_pattern).

    Every other layer is ``kinds[1]``. A dotted key is nested ("linear_attn_config.full_attn_layers").
    """

    form: str
    keys: tuple[str, ...]
    kinds: tuple[str, str] = ("full_attention", "linear_attention")
    names: tuple[tuple[str, str], ...] = ()
    one_based: bool = False


@dataclass(frozen=True)
class LayerKinds:
    """What kind each layer of a hybrid model is (transformers' vocabulary: "full_attention",
    "linear_attention", "conv", "mlp", "dense", "sparse", …), and the kinds this row edits: those with
    per-head attention at ``Layout.o_proj`` (``Layout.layer_kinds``) or with a dense MLP
    (``Layout.mlp_kinds``). Heads of other kinds (linear attention, state-space, convolution) are not
    heads of softmax attention with a per-head output slice: their edits are refused per layer."""

    rules: tuple[KindRule, ...]   # the first whose keys config.json has decides
    editable: tuple[str, ...]


# Kinds of layers whose cache is keys and values only (transformers' ALLOWED_ATTN_LAYER_TYPES, less
# the recurrent, convolution, compressed and mixed ones).
ATTENTION_KINDS = ("full_attention", "sliding_attention", "chunked_attention")

# transformers' older names of layer kinds (configuration_utils._LEGACY_LAYER_TYPE_REMAP; a test compares).
LEGACY_KINDS = {"mamba": "linear_attention", "attention": "full_attention",
                "deepseek_sparse_attention": "indexed_attention", "qwen_sparse_attention": "indexed_attention"}


# MLA rows: no q/k/v of their own (Mla names the matrices); the MLP kinds of DeepSeek-style MoE configs.
_MLA_ATTENTION: dict[str, Any] = dict(mla=Mla(), q_proj=None, k_proj=None, v_proj=None)
_SPARSE_LIST = LayerKinds((KindRule("list", ("mlp_layer_types",)),), editable=("dense",))
_DEEPSEEK_MLP = LayerKinds((KindRule("list", ("mlp_layer_types",)),
                            KindRule("first", ("first_k_dense_replace",), ("dense", "sparse"))), editable=("dense",))
_LAYER_TYPES = LayerKinds((KindRule("list", ("layer_types",)),), editable=("full_attention",))
_QWEN_HYBRID = LayerKinds((KindRule("list", ("layer_types",)), KindRule("interval", ("full_attention_interval",))),
                          editable=("full_attention",))


def _nemotron_h_kinds(editable: str) -> LayerKinds:
    """Nemotron-H: one block per layer (state-space, attention, MLP or experts), in either spelling."""
    return LayerKinds((KindRule("list", ("layers_block_type",)), KindRule("pattern", ("hybrid_override_pattern",),
                       names=(("M", "linear_attention"), ("E", "moe"), ("*", "full_attention"), ("-", "mlp")))),
                      editable=(editable,))


_DECODER = ("model.layers.{layer}.",)
_QWEN_EXPERTS = ("mlp.experts.{expert}.gate_proj", "mlp.experts.{expert}.up_proj",
                 "mlp.experts.{expert}.down_proj")

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
    "mixtral": Layout(_DECODER, experts=Experts(
        ("num_local_experts",), "intermediate_size",
        ("block_sparse_moe.experts.{expert}.w1", "block_sparse_moe.experts.{expert}.w3",
         "block_sparse_moe.experts.{expert}.w2"))),
    "qwen2_moe": Layout(_DECODER, experts=Experts(
        ("num_experts", "num_local_experts"), "moe_intermediate_size", _QWEN_EXPERTS,
        shared="mlp.shared_expert", shared_size_key="shared_expert_intermediate_size",
        sparse_step_key="decoder_sparse_step", dense_layers_key="mlp_only_layers")),
    "qwen3_moe": Layout(_DECODER, experts=Experts(
        ("num_experts", "num_local_experts"), "moe_intermediate_size", _QWEN_EXPERTS,
        sparse_step_key="decoder_sparse_step", dense_layers_key="mlp_only_layers")),
    "olmoe": Layout(_DECODER, experts=Experts(("num_experts",), "intermediate_size", _QWEN_EXPERTS)),
    "gpt_oss": Layout(_DECODER, experts=Experts(
        ("num_local_experts",), "intermediate_size", None, transposed=True, interleaved=True)),
    # --- MLA, DeepSeek-V4, hybrid layers (issue 24) ---
    # MLA: a head is its v_head_dim columns of o_proj. The MoE families' experts are i24-moe's rows:
    # until then their sparse layers (mlp_kinds) refuse dense neuron edits, naming the layer.
    "minicpm3": Layout(_DECODER, **_MLA_ATTENTION, logit_scaling="logits_scaling"),
    "youtu": Layout(_DECODER, **_MLA_ATTENTION),
    "deepseek_v2": Layout(_DECODER, **_MLA_ATTENTION, mlp_kinds=_DEEPSEEK_MLP),
    "deepseek_v3": Layout(_DECODER, **_MLA_ATTENTION, mlp_kinds=_DEEPSEEK_MLP),
    "sarvam_mla": Layout(_DECODER, **_MLA_ATTENTION, mlp_kinds=_DEEPSEEK_MLP),
    # DeepSeek sparse attention: an indexer picks each query's keys and keeps its own key cache.
    "deepseek_v32": Layout(_DECODER, **_MLA_ATTENTION, mlp_kinds=_DEEPSEEK_MLP, kv_cache=False),
    "glm_moe_dsa": Layout(_DECODER, **_MLA_ATTENTION, mlp_kinds=_DEEPSEEK_MLP, kv_cache=False),
    "glm4_moe_lite": Layout(_DECODER, **_MLA_ATTENTION, mlp_kinds=_SPARSE_LIST),
    "axk1": Layout(_DECODER, **_MLA_ATTENTION, mlp_kinds=_SPARSE_LIST),
    # A.X K2: MLA whose queries and output gate come from one fused q_gate_proj (no q_b_proj), DSA indexer.
    "axk2": Layout(_DECODER, **{**_MLA_ATTENTION, "mla": Mla(q_b_proj=None)}, mlp_kinds=_SPARSE_LIST,
                   kv_cache=False),
    # Hunyuan-V4: MLA with hyper-connection residual streams around each block (linear in o_proj's
    # output, so a head scale is still exact); its dense MLP's gate is stored as mlp.linear_gate.
    "hy_v4": Layout(_DECODER, **_MLA_ATTENTION, mlp_kinds=_SPARSE_LIST, kv_cache=False, final_head="hc_head",
                    stored_names=(("mlp.gate_proj", "mlp.linear_gate"),)),
    # DeepSeek-V4: heads through the grouped o_a_proj; every MLP is a mixture of experts.
    "deepseek_v4": Layout(
        ("model.layers.{layer}.", "layers.{layer}."), o_proj="self_attn.o_a_proj", q_proj=None, k_proj=None,
        v_proj=None, grouped_output=GroupedOutput(), kv_cache=False, final_head="hc_head", token_keys=False,
        mlp_kinds=LayerKinds((KindRule("list", ("mlp_layer_types",)),), editable=()),
        stored_names=(("self_attn.o_a_proj", "attn.wo_a"), ("self_attn.o_b_proj", "attn.wo_b"),
                      ("self_attn.kv_proj", "attn.wkv"))),
    # Hybrid layers: heads in the softmax-attention layers only, MLP neurons where a dense MLP is.
    "qwen3_5_text": Layout(_DECODER, layer_kinds=_QWEN_HYBRID, q_gate=True),
    "qwen3_5": Layout(("model.language_model.layers.{layer}.",), text_config_key="text_config",
                      layer_kinds=_QWEN_HYBRID, q_gate=True),
    "qwen3_next": Layout(_DECODER, layer_kinds=_QWEN_HYBRID, q_gate=True, experts=Experts(
        ("num_experts",), "moe_intermediate_size", _QWEN_EXPERTS, shared="mlp.shared_expert",
        shared_size_key="shared_expert_intermediate_size", sparse_step_key="decoder_sparse_step",
        dense_layers_key="mlp_only_layers")),
    "olmo_hybrid": Layout(_DECODER, layer_kinds=_LAYER_TYPES),
    "lfm2": Layout(_DECODER, o_proj="self_attn.out_proj", gate_proj="feed_forward.w1", up_proj="feed_forward.w3",
                   down_proj="feed_forward.w2", final_norm="embedding_norm",
                   ffn_adjust=("block_auto_adjust_ff_dim", "block_ffn_dim_multiplier", "block_multiple_of"),
                   layer_kinds=LayerKinds(
                       (KindRule("list", ("layer_types",)),
                        KindRule("indices", ("full_attn_idxs",), ("full_attention", "conv"))), ("full_attention",))),
    "lfm3": Layout(_DECODER, gate_proj="feed_forward.w1", up_proj="feed_forward.w3", down_proj="feed_forward.w2",
                   final_norm="embedding_norm", layer_kinds=LayerKinds((KindRule("list", ("layer_types",)),),
                                                                       ("full_attention", "sliding_attention"))),
    # Falcon-H1: attention and a state-space block side by side in every layer.
    "falcon_h1": Layout(_DECODER, gate_proj="feed_forward.gate_proj", up_proj="feed_forward.up_proj",
                        down_proj="feed_forward.down_proj", final_norm="final_layernorm", kv_cache=False),
    "bamba": Layout(_DECODER, gate_proj="feed_forward.gate_proj", up_proj="feed_forward.up_proj",
                    down_proj="feed_forward.down_proj", final_norm="final_layernorm", layer_kinds=LayerKinds(
                        (KindRule("indices", ("attn_layer_indices",)),), ("full_attention",))),
    "jamba": Layout(_DECODER, gate_proj="feed_forward.gate_proj", up_proj="feed_forward.up_proj",
                    down_proj="feed_forward.down_proj", final_norm="final_layernorm", layer_kinds=LayerKinds(
                        (KindRule("period", ("attn_layer_period", "attn_layer_offset")),), ("full_attention",)),
                    mlp_kinds=LayerKinds((KindRule("period", ("expert_layer_period", "expert_layer_offset"),
                                                   ("sparse", "dense")),), ("dense",))),
    # Nemotron-H: one block per layer (state-space, attention, ungated MLP or experts); stored under backbone.
    "nemotron_h": Layout(("model.layers.{layer}.", "backbone.layers.{layer}."), o_proj="mixer.o_proj",
                         q_proj="mixer.q_proj", k_proj="mixer.k_proj", v_proj="mixer.v_proj", gate_proj=None,
                         up_proj="mixer.up_proj", down_proj="mixer.down_proj", final_norm="norm_f",
                         layer_kinds=_nemotron_h_kinds("full_attention"), mlp_kinds=_nemotron_h_kinds("mlp")),
    "recurrent_gemma": Layout(
        _DECODER, o_proj="temporal_block.o_proj", q_proj="temporal_block.q_proj", k_proj="temporal_block.k_proj",
        v_proj="temporal_block.v_proj", gate_proj="mlp_block.gate_proj", up_proj="mlp_block.up_proj",
        down_proj="mlp_block.down_proj", final_norm="final_norm", logit_softcap="logits_soft_cap", ffn_divisor=2,
        layer_kinds=LayerKinds((KindRule("cycle", ("block_types",), names=(
            ("recurrent", "linear_attention"), ("attention", "sliding_attention"))),), ("sliding_attention",))),
    "kimi_linear": Layout(_DECODER, **_MLA_ATTENTION, layer_kinds=LayerKinds(
        (KindRule("list", ("layer_types",)),
         KindRule("indices", ("linear_attn_config.full_attn_layers",), one_based=True)), ("full_attention",)),
        mlp_kinds=_DEEPSEEK_MLP, stored_names=(("mlp.", "block_sparse_moe."),)),
    # Ling/Bailing hybrid: MLA in its full-attention layers, stored under attention.* (o_proj as dense).
    "bailing_hybrid": Layout(_DECODER, **_MLA_ATTENTION, stored_names=(
        ("self_attn.o_proj", "attention.dense"), ("self_attn.", "attention.")), layer_kinds=LayerKinds(
        (KindRule("list", ("layer_types",)), KindRule("interval", ("layer_group_size",))), ("full_attention",)),
        mlp_kinds=_DEEPSEEK_MLP),
}

TABLE_LOCATION = "surgery/core/architectures.py (the ARCHITECTURES table)"

# --- MLA, DeepSeek-V4, hybrid layers (issue 24): causal-LM types refused, and why ---
REFUSED: dict[str, str] = {
    "zamba": "its attention and MLP are one shared block reused by every hybrid layer: an edit of one layer "
             "would edit them all",
    "zamba2": "its attention and MLP blocks are shared across hybrid layers (with per-layer adapters): an edit "
              "of one layer would edit every layer sharing the block",
    "dots3_note": "its layers mix MLA (indexed attention) and plain attention with different head sizes",
    "dots3_note_text": "its layers mix MLA (indexed attention) and plain attention with different head sizes",
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
    # Issue 24 (empty / None / 0 where the row has none): MLA sizes, the kind of each layer (hybrid
    # models: attention side, MLP side), DeepSeek-V4's output groups and their rank.
    mla: "MlaSizes | None" = None
    layer_kinds: tuple[str, ...] = ()
    mlp_kinds: tuple[str, ...] = ()
    o_groups: int = 0
    o_rank: int = 0
    # The vocabulary (rows of the embedding table); not part of to_dict (findings predate it).
    vocab_size: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; a dense model's dict has only the dense fields (findings written before MoE
        support record exactly those, and must still match)."""
        out = {k: v for k, v in self.__dict__.items() if k not in _MOE_FIELDS + _SHAPE_FIELDS + ("vocab_size",)}
        if self.num_experts:
            out.update(num_experts=self.num_experts, expert_size=self.expert_size,
                       shared_size=self.shared_size, sparse_layers=sorted(self.sparse_layers))
        # the same for the fields of issue 24: present only where the model has them
        for k in _SHAPE_FIELDS:
            if v := getattr(self, k):
                out[k] = dict(v.__dict__) if isinstance(v, MlaSizes) else list(v) if isinstance(v, tuple) else v
        return out


_MOE_FIELDS = ("num_experts", "expert_size", "shared_size", "sparse_layers")
_SHAPE_FIELDS = ("mla", "layer_kinds", "mlp_kinds", "o_groups", "o_rank")


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

    def root_prefix(self, names: Iterable[str]) -> str:
        """The prefix of what sits next to the layer list (embeddings, final norm), e.g. ``model.``."""
        return self.layer_prefix(names).split("layers.{layer}.")[0]

    def loaded_name(self, native: str) -> tuple[str, bool] | None:
        """The transformers name of a tensor stored under a native name (see ``NativeName``), and
        whether its rows are permuted; None when the table knows no such name."""
        for entry in self.layout.native_names:
            if match := re.fullmatch(entry.pattern, native):
                return match.expand(entry.loaded), entry.permuted
        return None

    def is_sparse(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is a mixture of experts."""
        return layer in self.geometry.sparse_layers

    def fused_experts(self, names: Iterable[str]) -> bool:
        """Whether ``names`` (a checkpoint's tensors) hold the experts fused (3-D) or one per expert.

        Decided from the names of the first sparse layer; quantized experts (GPT-OSS's MXFP4
        ``_blocks``/``_scales``) and anything else are one clear line.
        """
        ex = self.layout.experts
        names = set(names)
        layer = min(self.geometry.sparse_layers)
        prefix = self.layer_prefix(names).format(layer=layer)
        fused = f"{prefix}{ex.module}.gate_up_proj"
        if f"{fused}_blocks" in names:
            raise CheckpointError(f"{self.model_type}: the experts are quantized ('{fused}_blocks', MXFP4); "
                                  "surgery edits F32, F16 and BF16 weights only: use a dequantized (bf16) copy")
        if fused in names:
            return True
        if ex.per_expert and f"{prefix}{ex.per_expert[0].format(expert=0)}.weight" in names:
            return False
        spelled = [fused] + ([f"{prefix}{ex.per_expert[0].format(expert=0)}.weight"] if ex.per_expert else [])
        raise UnsupportedArchitecture(f"{self.model_type}: layer {layer} has no expert tensors (looked for "
                                      f"{' or '.join(spelled)}); extend {TABLE_LOCATION}")

    def expert_slices(self, expert: int, part: str, fused: bool
                      ) -> list[tuple[str, tuple[int, ...], int, int, bool]]:
        """Where a per-expert matrix ``part`` ("gate", "up", "down"; standard [out, in] orientation)
        of ``expert`` lies on disk, as (tensor relative to the layer, its full shape, first row and
        number of rows of the expert's window in the tensor viewed as 2-D [rows, last dim], and
        ``flipped``: the matrix's rows are the window's columns and vice versa). A fused gate/up
        window holds both halves: :meth:`expert_rows` says which of its rows (columns) are a neuron's.
        """
        ex, g = self.layout.experts, self.geometry
        E, H, I = g.num_experts, g.hidden_size, g.expert_size
        if not fused:
            name = ex.per_expert[("gate", "up", "down").index(part)].format(expert=expert) + ".weight"
            shape = (H, I) if part == "down" else (I, H)
            return [(name, shape, 0, shape[0], False)]
        base = f"{ex.module}.{'down_proj' if part == 'down' else 'gate_up_proj'}"
        if part == "down":
            shape = (E, I, H) if ex.transposed else (E, H, I)
            return [(base, shape, expert * shape[1], shape[1], ex.transposed)]
        shape = (E, H, 2 * I) if ex.transposed else (E, 2 * I, H)
        out = [(base, shape, expert * shape[1], shape[1], ex.transposed)]
        if ex.interleaved:  # GPT-OSS: the gate/up bias [E, 2I] is pruned with the rows
            out.append((f"{base}_bias", (E, 2 * I), expert, 1, True))
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
        if lay.mla or lay.grouped_output:
            return mla_shapes(self) if lay.mla else grouped_output_shapes(self)
        q_rows, kv_rows = g.num_heads * g.head_dim, g.num_kv_heads * g.head_dim
        q = f"num_attention_heads × head_dim = {g.num_heads} × {g.head_dim}"
        kv = f"num_key_value_heads × head_dim = {g.num_kv_heads} × {g.head_dim}"
        shapes = {lay.o_proj: ((g.hidden_size, q_rows), f"{q} columns")}
        if lay.q_proj:  # a gated attention's q_proj holds each head's query and gate: twice the rows
            gate = 2 if lay.q_gate else 1
            shapes[lay.q_proj] = ((gate * q_rows, g.hidden_size), f"{'2 × ' if lay.q_gate else ''}{q} rows")
        for name in (lay.k_proj, lay.v_proj):
            if name:
                shapes[name] = ((kv_rows, g.hidden_size), f"{kv} rows")
        if lay.qkv_proj:
            shapes[lay.qkv_proj] = ((q_rows + 2 * kv_rows, g.hidden_size),
                                    f"(num_attention_heads + 2 × num_key_value_heads) × head_dim = "
                                    f"({g.num_heads} + 2 × {g.num_kv_heads}) × {g.head_dim} rows")
        return shapes

    def attention_output(self) -> tuple[str, tuple[int, int]]:
        """The module that writes the attention's output into the residual stream (relative to a
        layer) and its weight's expected shape: o_proj, or DeepSeek-V4's o_b_proj, which mixes the
        groups of its grouped o_a_proj (``Layout.o_proj`` there)."""
        lay = self.layout
        module = lay.grouped_output.o_b_proj if lay.grouped_output else lay.o_proj
        return module, self.attention_shapes()[module][0]

    def head_columns(self, head: int) -> slice:
        """Columns of o_proj (its input features) that carry ``head``'s output (DeepSeek-V4: within
        its group, see :meth:`head_group`)."""
        d = self.geometry.head_dim
        if self.layout.grouped_output:
            head %= self.geometry.num_heads // self.geometry.o_groups
        return slice(head * d, (head + 1) * d)

    # --- issue 24: hybrid layers, MLA, stored names ----------------------------------------------

    def head_group(self, head: int) -> tuple[int, int] | None:
        """(group, groups) of ``head`` where o_proj is a grouped linear (DeepSeek-V4's o_a_proj: the
        heads' outputs split into groups, each projected by its own block of rows); else None."""
        g = self.geometry
        if not self.layout.grouped_output:
            return None
        return head // (g.num_heads // g.o_groups), g.o_groups

    def stored_module(self, module: str) -> str:
        """The name a checkpoint stores ``module`` (relative to a layer) under."""
        for loaded, stored in self.layout.stored_names:
            if module.startswith(loaded):
                return stored + module[len(loaded):]
        return module

    def layer_kind(self, layer: int) -> str | None:
        """The kind of ``layer`` in a hybrid model ("full_attention", "linear_attention", …); None: not hybrid."""
        kinds = self.geometry.layer_kinds
        return kinds[layer] if kinds else None

    def head_layers(self) -> tuple[int, ...]:
        """The layers with attention heads at o_proj (all but a hybrid model's other kinds)."""
        lk, n = self.layout.layer_kinds, self.geometry.num_layers
        if lk is None:
            return tuple(range(n))
        return tuple(i for i, kind in enumerate(self.geometry.layer_kinds) if kind in lk.editable)

    def dense_mlp_layers(self) -> tuple[int, ...]:
        """The layers with a dense MLP (not a mixture of experts, not a layer without MLP)."""
        mk, g = self.layout.mlp_kinds, self.geometry
        return tuple(i for i in range(g.num_layers) if not self.is_sparse(i)
                     and (mk is None or g.mlp_kinds[i] in mk.editable))

    def kv_cache_only(self) -> bool:
        """Whether the model caches one key/value pair per layer and nothing else (no state-space,
        convolution or compressed state): a shared prefix or a resumed pass may slice its cache."""
        return self.layout.kv_cache and all(k in ATTENTION_KINDS for k in self.geometry.layer_kinds)

    def kinds_summary(self) -> dict[str, dict[str, Any]]:
        """Per layer kind of a hybrid model: its layers and what an edit may touch there (heads,
        dense MLP neurons); empty for a model whose layers are all alike."""
        g = self.geometry
        if not (g.layer_kinds or g.mlp_kinds):
            return {}
        heads, mlp = set(self.head_layers()), set(self.dense_mlp_layers())
        out: dict[str, dict[str, Any]] = {}
        for i in range(g.num_layers):
            # the attention side's kind and the MLP side's, once where one list says both (Nemotron-H)
            kind = " + ".join(dict.fromkeys(k for k in (self.layer_kind(i), g.mlp_kinds[i] if g.mlp_kinds else None)
                                            if k))
            row = out.setdefault(kind, {"layers": [], "heads": i in heads, "neurons": i in mlp,
                                        "experts": self.is_sparse(i)})
            row["layers"].append(i)
        return out


# --- MLA, DeepSeek-V4's grouped output, hybrid layer kinds (issue 24): shapes and kinds from the config ---

def mla_shapes(arch: Architecture) -> dict[str, tuple[tuple[int, int], str]]:
    """Expected shapes of an MLA layer's matrices (see :class:`Mla`), as ``Architecture.attention_shapes``."""
    g, mla, m = arch.geometry, arch.layout.mla, arch.geometry.mla
    heads, H, qk = g.num_heads, g.hidden_size, m.qk_nope_head_dim + m.qk_rope_head_dim
    q = f"num_attention_heads × (qk_nope_head_dim + qk_rope_head_dim) = {heads} × {qk} rows"
    shapes = {arch.layout.o_proj: ((H, heads * m.v_head_dim),
                                   f"num_attention_heads × v_head_dim = {heads} × {m.v_head_dim} columns"),
              mla.kv_a_proj: ((m.kv_lora_rank + m.qk_rope_head_dim, H),
                              f"kv_lora_rank + qk_rope_head_dim = {m.kv_lora_rank} + {m.qk_rope_head_dim} rows"),
              mla.kv_b_proj: ((heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
                              f"num_attention_heads × (qk_nope_head_dim + v_head_dim) = {heads} × "
                              f"{m.qk_nope_head_dim + m.v_head_dim} rows, kv_lora_rank = {m.kv_lora_rank} columns")}
    if m.q_lora_rank is None and mla.q_proj:
        shapes[mla.q_proj] = ((heads * qk, H), q)
    if m.q_lora_rank is not None and mla.q_a_proj:
        shapes[mla.q_a_proj] = ((m.q_lora_rank, H), f"q_lora_rank = {m.q_lora_rank} rows")
    if m.q_lora_rank is not None and mla.q_b_proj:
        shapes[mla.q_b_proj] = ((heads * qk, m.q_lora_rank), f"{q}, q_lora_rank = {m.q_lora_rank} columns")
    return shapes


def grouped_output_shapes(arch: Architecture) -> dict[str, tuple[tuple[int, int], str]]:
    """Expected shapes of DeepSeek-V4's attention matrices (see :class:`GroupedOutput`)."""
    g, go = arch.geometry, arch.layout.grouped_output
    heads, d, G, R, H = g.num_heads, g.head_dim, g.o_groups, g.o_rank, g.hidden_size
    return {arch.layout.o_proj: ((G * R, heads * d // G),
                                 f"o_groups × o_lora_rank = {G} × {R} rows, num_attention_heads × head_dim / "
                                 f"o_groups = {heads} × {d} / {G} columns"),
            go.o_b_proj: ((H, G * R), f"o_groups × o_lora_rank = {G} × {R} columns"),
            go.kv_proj: ((d, H), f"head_dim = {d} rows (one key/value head)")}


_MISSING = object()


def _lookup(cfg: Mapping[str, Any], key: str) -> Any:
    """``cfg[key]`` (a dotted key reads a nested dict); _MISSING when absent (null is a value)."""
    value: Any = cfg
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _kinds_by_rule(rule: KindRule, values: list[Any], n: int, where: str) -> tuple[str, ...]:
    """The kind of each of ``n`` layers that ``rule`` gives with its keys' ``values``."""
    chosen, other = rule.kinds
    names = {**LEGACY_KINDS, **dict(rule.names)}
    if rule.form in ("list", "cycle", "pattern"):
        seq = values[0]
        if not isinstance(seq, (list, str)) or not seq or not all(isinstance(k, str) for k in seq):
            raise UnsupportedArchitecture(f"{where}: '{rule.keys[0]}' must be a list of layer kinds, got {seq!r}")
        if rule.form == "cycle":
            seq = (list(seq) * n)[:n]
        if len(seq) != n:
            raise UnsupportedArchitecture(f"{where}: '{rule.keys[0]}' has {len(seq)} entries but num_hidden_layers "
                                          f"= {n}; the config contradicts itself")
        return tuple(names.get(k, k) for k in seq)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values if not isinstance(v, (list, type(None)))):
        raise UnsupportedArchitecture(f"{where}: {', '.join(repr(k) for k in rule.keys)} must be integers, "
                                      f"got {values}")
    if rule.form == "interval":
        return tuple(chosen if (i + 1) % max(values[0], 1) == 0 else other for i in range(n))
    if rule.form == "period":
        period, offset = values
        return tuple(chosen if i % max(period, 1) == offset else other for i in range(n))
    if rule.form == "first":
        return tuple(chosen if i < values[0] else other for i in range(n))
    if rule.form == "indices":
        listed = {i - rule.one_based for i in (values[0] or [])}
        return tuple(chosen if i in listed else other for i in range(n))
    raise ValueError(f"unknown KindRule form {rule.form!r}")


def read_kinds(kinds: LayerKinds, cfg: Mapping[str, Any], n: int, model_type: str) -> tuple[str, ...]:
    """The kind of every layer, by the first of ``kinds.rules`` whose keys config.json has."""
    where = f"config.json of this {model_type} model"
    for rule in kinds.rules:
        values = [_lookup(cfg, k) for k in rule.keys]
        if any(v is _MISSING for v in values) or (rule.form != "indices" and None in values):
            continue
        return _kinds_by_rule(rule, values, n, where)
    keys = " or ".join(repr(" + ".join(r.keys)) for r in kinds.rules)
    raise UnsupportedArchitecture(f"{where} has no {keys} (what kind each layer is); "
                                  "is it a complete transformers config?")


def _mla_sizes(cfg: Mapping[str, Any], need) -> MlaSizes:
    rank = cfg.get("q_lora_rank")
    return MlaSizes(None if rank is None else need("q_lora_rank"), need("kv_lora_rank"), need("qk_nope_head_dim"),
                    need("qk_rope_head_dim"), need("v_head_dim"))


def _num_layers(layout: Layout, cfg: Mapping[str, Any], need) -> int:
    """num_hidden_layers; Nemotron-H's config has none, its per-layer kinds are the layers."""
    if "num_hidden_layers" not in cfg and layout.layer_kinds:
        for rule in layout.layer_kinds.rules:
            if rule.form in ("list", "pattern") and isinstance(kinds := _lookup(cfg, rule.keys[0]), (list, str)):
                return len(kinds)
    return need("num_hidden_layers")


def _mlp_width(layout: Layout, cfg: Mapping[str, Any], need) -> int:
    """The dense MLP's width: intermediate_size, or what ``Layout.ffn_adjust`` derives from it."""
    width = need("intermediate_size") // layout.ffn_divisor
    if layout.ffn_adjust and cfg.get(layout.ffn_adjust[0]):
        switch, multiplier, multiple = layout.ffn_adjust
        width = int(2 * width / 3)
        if cfg.get(multiplier) is not None:
            step = need(multiple)
            width = step * ((int(cfg[multiplier] * width) + step - 1) // step)
    return width


def _issue24_geometry(layout: Layout, model_type: str, cfg: Mapping[str, Any], geometry: Geometry, need
                      ) -> Geometry:
    """``geometry`` with what the row's MLA, grouped output and layer kinds read from the config."""
    n = geometry.num_layers
    out = geometry
    if layout.mla:  # a head's width in o_proj is v_head_dim (q·k heads are wider)
        mla = _mla_sizes(cfg, need)
        out = replace(out, mla=mla, head_dim=mla.v_head_dim)
    if layout.grouped_output:
        out = replace(out, o_groups=need("o_groups"), o_rank=need("o_lora_rank"))
        if out.num_heads % out.o_groups:
            raise UnsupportedArchitecture(f"config.json of this {model_type} model: num_attention_heads = "
                                          f"{out.num_heads} is not a multiple of o_groups = {out.o_groups}")
    if layout.layer_kinds:
        out = replace(out, layer_kinds=read_kinds(layout.layer_kinds, cfg, n, model_type))
    if layout.mlp_kinds:
        out = replace(out, mlp_kinds=read_kinds(layout.mlp_kinds, cfg, n, model_type))
    return out


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
    layers = _num_layers(ARCHITECTURES[model_type], cfg, need)
    # head_dim is explicit in Gemma/Qwen3 configs and differs from hidden/heads there.
    head_dim = cfg.get("head_dim") or hidden // heads
    layout = ARCHITECTURES[model_type]
    dense = _issue24_geometry(layout, model_type, cfg, Geometry(
        layers, heads, int(cfg.get("num_key_value_heads") or heads), int(head_dim), hidden,
        _mlp_width(layout, cfg, need) if layout.mlp_kinds is None or layout.mlp_kinds.editable else 0,
        vocab_size=int(cfg.get("vocab_size") or 0)), need)
    ex = layout.experts
    if ex is None:
        return dense
    num = next((k for k in ex.num_keys if cfg.get(k) is not None), ex.num_keys[0])
    step = int(cfg.get(ex.sparse_step_key) or 1) if ex.sparse_step_key else 1
    only_dense = set(cfg.get(ex.dense_layers_key) or []) if ex.dense_layers_key else set()
    # transformers' rule (Qwen-MoE): experts where layer ∉ mlp_only_layers and (layer+1) % step == 0.
    sparse = frozenset(i for i in range(layers) if i not in only_dense and (i + 1) % step == 0)
    return replace(dense, num_experts=need(num), expert_size=need(ex.size_key),
                   shared_size=need(ex.shared_size_key) if ex.shared_size_key else 0,
                   sparse_layers=sparse if need(num) > 0 else frozenset())


def architecture(config: Mapping[str, Any]) -> Architecture:
    """Look up a config dict (config.json) in the table."""
    model_type = config.get("model_type")
    layout = ARCHITECTURES.get(str(model_type))
    if str(model_type) in REFUSED:
        raise UnsupportedArchitecture(f"model_type '{model_type}' is not supported: {REFUSED[str(model_type)]}")
    if layout is None:
        raise UnsupportedArchitecture(
            f"model_type '{model_type}' is not supported (supported: "
            f"{', '.join(sorted(ARCHITECTURES))}); to add it, extend {TABLE_LOCATION}"
        )
    return Architecture(str(model_type), layout, _geometry(str(model_type), text_config(config)))
