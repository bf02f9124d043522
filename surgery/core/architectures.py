"""The one place that knows where heads and neurons live in each architecture.

Everything else asks this table for tensor and module names. Supporting a new model_type means
adding a row to ``ARCHITECTURES`` below, never a try/except elsewhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping

from .errors import CheckpointError, UnsupportedArchitecture


@dataclass(frozen=True)
class ConfigKeys:
    """The config.json keys a family spells Geometry's sizes with, by their transformers names.

    Most families use the names themselves; others spell them as their config class's
    ``attribute_map`` says (GPT-2: ``num_hidden_layers`` → ``n_layer``) or with keys of their own
    (OPT's ``ffn_dim``). Read as data, so the bake path needs no transformers import; a test
    compares every row with the config class. ``None``: the family has no such key (every head has
    its own keys and values; ``head_dim`` is hidden_size / num_attention_heads).
    """

    num_hidden_layers: str = "num_hidden_layers"
    num_attention_heads: str = "num_attention_heads"
    hidden_size: str = "hidden_size"
    intermediate_size: str | None = "intermediate_size"
    num_key_value_heads: str | None = "num_key_value_heads"
    head_dim: str | None = "head_dim"
    # When the intermediate_size key is absent or null (or the family has none), the MLP is
    # hidden_size × this wide: a number (GPT-2's 4 × n_embd) or the key that holds it (MPT's expansion_ratio).
    mlp_ratio: int | str | None = None
    # Flags that decide the number of k/v heads, first true one wins: (flag, count or the key that
    # holds it). Falcon: new_decoder_architecture → num_kv_heads, multi_query → 1, else every head.
    kv_heads_when: tuple[tuple[str, int | str], ...] = ()


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
    # the final norm, a sibling of the layer list (None: none, GPT-1 is post-norm), and the config
    # field of a logit soft-cap.
    final_norm: str | None = "norm"
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
    # DeepSeek-V4's ("self_attn.o_a_proj", "attn.wo_a"), Ling's ("self_attn.", "attention."); a
    # checkpoint may hold either spelling (a re-save under the loaded names).
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
    # A multimodal wrapper: the model types its text_config may name (the text decoder this row
    # describes; empty: not a wrapper), and the transformers auto class that loads the whole model
    # (a wrapper that AutoModelForCausalLM does not map, e.g. Mistral-3, loads as image-text-to-text).
    text_model_types: tuple[str, ...] = ()
    model_class: str = "AutoModelForCausalLM"
    # Layers that lack attention inputs or have a wider MLP than the config's top level says (Gemma 4).
    layer_sizes: "LayerSizes | None" = None
    # Why head edits are refused on this family (None: heads are the o_proj input columns of the
    # head layers), e.g. DiffLlama's differential head pairs (its o_proj columns are not num_heads heads
    # of head_dim): the attention shapes are then not checked either (no head layout to check them by).
    head_refusal: str | None = None
    # --- issue 24 (dense families) ---
    # How config.json spells the sizes (GPT-2's n_layer, n_head, n_embd, n_inner …): see ConfigKeys.
    config_keys: ConfigKeys = ConfigKeys()
    # Modules that are transformers' Conv1D (GPT-2): the weight is stored [in, out], so a column of
    # the [out, in] map is a stored row. Sites keep the [out, in] view; the resolver flips them.
    conv1d: tuple[str, ...] = ()
    # Whether a pruned neuron's MLP input rows are zeroed too. The down_proj column alone is the exact
    # edit; zero input rows make the neuron dead in the weights as well, but only where act(0) = 0
    # and nothing else reads those rows: not with xIELU (act(0) ≠ 0), nor where a norm over the MLP's
    # hidden units (BitNet's ffn_sub_norm) would see the zeros and change every other neuron.
    prune_inputs: bool = True
    # The model's tail after the final norm and lm_head, as config keys: logits × multiplier
    # (Cohere's logit_scale, HyperCLOVA X's logits_scaling), logits ÷ divisor (Granite's logits_scaling).
    logit_multiplier: str | None = None
    logit_divisor: str | None = None
    # A module of the causal LM between the final norm and the output embeddings (ModernBERT's
    # prediction head, "lm_head": dense, activation, norm); None: none.
    pre_head: str | None = None
    # transformers' checkpoint conversion renames of this family (conversion_mapping.py), as
    # (on-disk regex, loaded replacement) in its order: save_pretrained writes the on-disk names
    # (EXAONE's transformer.h.N.attn.attention.out_proj), the loaded model has the others. A test
    # compares them with transformers' mapping.
    renames: tuple[tuple[str, str], ...] = ()


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


@dataclass(frozen=True)
class LayerSizes:
    """A family's rules for layers that differ from config.json's top-level sizes (Gemma 4), each a
    config key: the last ``kv_shared_key`` layers reuse an earlier layer's keys and values (they have
    no k_proj, v_proj); with ``k_eq_v_key`` true the full-attention layers take their values from
    k_proj (no v_proj); with ``double_wide_key`` true the kv-shared layers' MLP is twice
    intermediate_size wide. (Per-layer head sizes come from transformers' ``per_layer_config``,
    read for every family.)"""

    kv_shared_key: str | None = None
    k_eq_v_key: str | None = None
    double_wide_key: str | None = None


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

# What a hybrid model's layer of a kind holds that surgery does not edit, and why, by (side, kind):
# "heads" for a layer outside the row's attention kinds, "mlp" for one without a dense MLP or the
# row's experts. A kind not listed holds no such part (e.g. Nemotron-H's attention-only layers).
_UNDESCRIBED_EXPERTS = "experts (this table row does not describe its mixture of experts)"
KIND_REFUSALS: dict[tuple[str, str], str] = {
    ("heads", "linear_attention"): "heads of linear attention or a state-space scan (only softmax-attention heads "
                                   "are edited)",
    ("heads", "conv"): "a short convolution in place of attention (no heads)",
    **{("mlp", kind): _UNDESCRIBED_EXPERTS for kind in ("sparse", "moe", "hash_moe")},
}


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
_QWEN4_HEADS = ("its attention layers pick their keys through a QSA indexer and sit inside hyper-connection residual "
                "streams: head edits on qwen4_exp are not in the table yet; edit its expert neurons")

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
        text_model_types=("gemma3_text",),
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
    "glm4_moe": Layout(_DECODER, experts=replace(_DEEPSEEK_EXPERTS, layer_types_key=None, first_dense_default=1)),
    "dots1": Layout(_DECODER, experts=replace(_DEEPSEEK_EXPERTS, layer_types_key=None, first_dense_default=0)),
    "solar_open": Layout(_DECODER, experts=replace(_DEEPSEEK_EXPERTS, layer_types_key=None, first_dense_key=None,
                                                   first_dense_default=0, dense_size_keys=())),
    # Sarvam-MoE releases store Bailing-style attention: attention.dense (o_proj), one fused query_key_value.
    "sarvam_moe": Layout(_DECODER, q_proj=None, k_proj=None, v_proj=None,
                         stored_names=(("self_attn.o_proj.", "attention.dense."),),
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
    "hy_v3": Layout(_DECODER, stored_names=(("mlp.shared_experts.", "mlp.shared_mlp."),), experts=Experts(
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
        stored_names=(("mlp.shared_experts.", "mlp.shared_expert."),), experts=Experts(
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
    "minimax": Layout(_DECODER, layer_kinds=_LAYER_TYPES, experts=Experts(
        ("num_local_experts",), "intermediate_size", _MIXTRAL_EXPERTS, dense_size_keys=(), aliases=_N_LOCAL)),

    # --- MLA, DeepSeek-V4, hybrid layers (issue 24) ---
    # MLA: a head is its v_head_dim columns of o_proj; the experts of the MoE families as in the section above.
    "minicpm3": Layout(_DECODER, **_MLA_ATTENTION, logit_scaling="logits_scaling"),
    "youtu": Layout(_DECODER, **_MLA_ATTENTION),
    "deepseek_v2": Layout(_DECODER, **_MLA_ATTENTION, experts=replace(
        _DEEPSEEK_EXPERTS, layer_types_key=None, first_dense_default=0,
        aliases=(("num_experts", "n_routed_experts"),))),
    "deepseek_v3": Layout(_DECODER, **_MLA_ATTENTION, experts=replace(_DEEPSEEK_EXPERTS, layer_types_key=None)),
    "sarvam_mla": Layout(_DECODER, **_MLA_ATTENTION, experts=replace(
        _DEEPSEEK_EXPERTS, layer_types_key=None, first_dense_default=1, aliases=_SARVAM)),
    # DeepSeek sparse attention: an indexer picks each query's keys and keeps its own key cache.
    "deepseek_v32": Layout(_DECODER, **_MLA_ATTENTION, experts=_DEEPSEEK_EXPERTS, kv_cache=False),
    "glm_moe_dsa": Layout(_DECODER, **_MLA_ATTENTION, experts=_DEEPSEEK_EXPERTS, kv_cache=False),
    # its config class reads head_dim as qk_rope_head_dim (a head's width in o_proj is MLA's v_head_dim)
    "glm4_moe_lite": Layout(_DECODER, **_MLA_ATTENTION, config_keys=ConfigKeys(head_dim="qk_rope_head_dim"),
                            experts=replace(_DEEPSEEK_EXPERTS, first_dense_key=None, first_dense_default=1)),
    "axk1": Layout(_DECODER, **_MLA_ATTENTION, experts=replace(
        _DEEPSEEK_EXPERTS, first_dense_default=1, sparse_step_key="moe_layer_freq", sparse_offset=0)),
    # A.X K2: MLA whose queries and output gate come from one fused q_gate_proj (no q_b_proj), DSA indexer.
    "axk2": Layout(_DECODER, **{**_MLA_ATTENTION, "mla": Mla(q_b_proj=None)}, kv_cache=False, experts=replace(
        _DEEPSEEK_EXPERTS, first_dense_default=1, sparse_step_key="moe_layer_freq", sparse_offset=0)),
    # Hunyuan-V4: MLA with hyper-connection residual streams around each block (linear in o_proj's
    # output, so a head scale is still exact); its dense MLP's gate is stored as mlp.linear_gate.
    "hy_v4": Layout(_DECODER, **_MLA_ATTENTION, mlp_kinds=_SPARSE_LIST, kv_cache=False, final_head="hc_head",
                    stored_names=(("mlp.gate_proj", "mlp.linear_gate"),)),
    # DeepSeek-V4: heads through the grouped o_a_proj; every MLP is a mixture of experts.
    "deepseek_v4": Layout(
        ("model.layers.{layer}.", "layers.{layer}."), o_proj="self_attn.o_a_proj", q_proj=None, k_proj=None,
        v_proj=None, grouped_output=GroupedOutput(), kv_cache=False, final_head="hc_head", token_keys=False,
        config_keys=ConfigKeys(intermediate_size="moe_intermediate_size"),  # its config class's attribute_map
        mlp_kinds=LayerKinds((KindRule("list", ("mlp_layer_types",)),), editable=()),
        stored_names=(("self_attn.o_a_proj", "attn.wo_a"), ("self_attn.o_b_proj", "attn.wo_b"),
                      ("self_attn.kv_proj", "attn.wkv"))),
    # Hybrid layers: heads in the softmax-attention layers only, MLP and expert neurons where they are.
    "qwen3_5_text": Layout(_DECODER, layer_kinds=_QWEN_HYBRID, q_gate=True),
    "qwen3_next": Layout(_DECODER, layer_kinds=_QWEN_HYBRID, q_gate=True, experts=Experts(
        ("num_experts",), "moe_intermediate_size", _QWEN_EXPERTS, shared="mlp.shared_expert",
        shared_size_key="shared_expert_intermediate_size", sparse_step_key="decoder_sparse_step",
        dense_layers_key="mlp_only_layers")),
    "qwen3_5_moe_text": Layout(_DECODER, layer_kinds=_QWEN_HYBRID, q_gate=True, experts=_QWEN35_EXPERTS),
    "lara_mini": Layout(_DECODER, layer_kinds=LayerKinds((KindRule("list", ("layer_types",)),),
                                                         ("full_attention", "sliding_attention")),
                        experts=replace(_QWEN35_EXPERTS, per_expert=None)),
    "olmo_hybrid": Layout(_DECODER, layer_kinds=_LAYER_TYPES),
    "lfm2": Layout(_DECODER, o_proj="self_attn.out_proj", gate_proj="feed_forward.w1", up_proj="feed_forward.w3",
                   down_proj="feed_forward.w2", final_norm="embedding_norm",
                   ffn_adjust=("block_auto_adjust_ff_dim", "block_ffn_dim_multiplier", "block_multiple_of"),
                   layer_kinds=LayerKinds(
                       (KindRule("list", ("layer_types",)),
                        KindRule("indices", ("full_attn_idxs",), ("full_attention", "conv"))), ("full_attention",))),
    "lfm2_moe": Layout(_DECODER, o_proj="self_attn.out_proj", gate_proj="feed_forward.w1", up_proj="feed_forward.w3",
                       down_proj="feed_forward.w2", final_norm="embedding_norm", layer_kinds=_LAYER_TYPES,
                       experts=Experts(
        ("num_experts",), "moe_intermediate_size",
        tuple(f"feed_forward.experts.{{expert}}.{w}" for w in ("w1", "w3", "w2")), module="feed_forward.experts",
        first_dense_key="num_dense_layers", first_dense_default=2)),
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
                    experts=Experts(
        ("num_experts",), "intermediate_size", tuple(n.replace("mlp.", "feed_forward.") for n in _QWEN_EXPERTS),
        module="feed_forward.experts", sparse_step_key="expert_layer_period",
        sparse_offset_key="expert_layer_offset", aliases=_N_EXPERTS)),
    # Granite-4 hybrids: Mamba-2 or attention per layer, experts and a shared MLP in every layer.
    "granitemoehybrid": Layout(_DECODER, layer_kinds=LayerKinds(
        (KindRule("list", ("layer_types",)), KindRule("list", ("layers_block_type",))), ("full_attention",)),
        experts=_GRANITE_SHARED),
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
    # Kimi-Linear: MLA in its full-attention layers; its releases keep the MLP under block_sparse_moe
    # (dense layers too), experts Mixtral-style.
    "kimi_linear": Layout(_DECODER, **_MLA_ATTENTION, layer_kinds=LayerKinds(
        (KindRule("list", ("layer_types",)),
         KindRule("indices", ("linear_attn_config.full_attn_layers",), one_based=True)), ("full_attention",)),
        stored_names=(("mlp.", "block_sparse_moe."),),
        experts=replace(_KIMI_EXPERTS, per_expert=_MIXTRAL_EXPERTS, first_dense_default=1)),
    # Ling/Bailing hybrid: MLA in its full-attention layers, stored under attention.* (o_proj as dense).
    "bailing_hybrid": Layout(_DECODER, **_MLA_ATTENTION, stored_names=(
        ("self_attn.o_proj", "attention.dense"), ("self_attn.", "attention.")), layer_kinds=LayerKinds(
        (KindRule("list", ("layer_types",)), KindRule("interval", ("layer_group_size",))), ("full_attention",)),
        experts=replace(_KIMI_EXPERTS, first_dense_default=2)),
    # Qwen4-exp: QSA-indexed attention (gated, every fourth layer) between gated delta-net layers, inside
    # hyper-connection residual streams.
    "qwen4_exp_text": Layout(_DECODER, head_refusal=_QWEN4_HEADS, experts=_QWEN35_EXPERTS),
}

# --- multimodal wrappers and Gemma 4 (issue 24) ---
# A wrapper's text decoder is edited in place and its other towers are copied byte for byte: its row
# is the text model's row under the wrapper's layer prefixes, where transformers 5 keeps the text
# decoder in memory and where it (and releases before 4.52) saves it.
_WRAPPED = ("model.language_model.layers.{layer}.", "language_model.model.layers.{layer}.")


def _wrapper(text_type: str, *also: str, model_class: str = "AutoModelForCausalLM") -> Layout:
    """The row of a wrapper around a ``text_type`` decoder (or one of ``also``, laid out alike):
    that decoder's row under the wrapper's prefixes, its sizes read from ``text_config``."""
    return replace(ARCHITECTURES[text_type], layer_prefixes=_WRAPPED, text_config_key="text_config",
                   text_model_types=(text_type, *also), model_class=model_class, native_names=())


ARCHITECTURES.update({
    # Gemma 4: full-attention layers with their own head size (per_layer_config), kv-shared layers
    # without k/v projections (and, with use_double_wide_mlp, a twice-wide MLP).
    "gemma4_text": Layout(_DECODER, logit_softcap="final_logit_softcapping", layer_sizes=LayerSizes(
        "num_kv_shared_layers", "attention_k_eq_v", "use_double_wide_mlp")),
})
ARCHITECTURES["gemma4_unified_text"] = ARCHITECTURES["gemma4_text"]
ARCHITECTURES.update({
    "gemma4": _wrapper("gemma4_text"),
    "qwen3_5": _wrapper("qwen3_5_text"),  # the hybrid decoder of the MLA, DeepSeek-V4 and hybrid rows' section
    "gemma4_unified": _wrapper("gemma4_unified_text"),
    # Phi-4-multimodal: Phi-3's decoder with its vision and audio encoders beside it (model.embed_tokens_extend).
    "phi4_multimodal": ARCHITECTURES["phi3"],
    "mistral3": _wrapper("mistral", "ministral3", model_class="AutoModelForImageTextToText"),
    "got_ocr2": _wrapper("qwen2"),
    "moss_transcribe_diarize": _wrapper("qwen3"),
    # Mixtures of experts: saved from the multimodal class (text layers under its language model) or,
    # by AutoModelForCausalLM, from the text model alone under model.layers.
    "qwen3_5_moe": replace(_wrapper("qwen3_5_moe_text"), layer_prefixes=_WRAPPED + _DECODER),
    "qwen4_exp": replace(_wrapper("qwen4_exp_text"), layer_prefixes=_WRAPPED + _DECODER),
    "llama4": replace(_wrapper("llama4_text"), layer_prefixes=_WRAPPED + _DECODER),
})

# --- dense (issue 24) ---
# Llama-shaped decoders (self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj), ungated MLPs (up → act →
# down), fused q/k/v, GPT-2's Conv1D, and config keys spelled the family's own way. What each row
# says is proven on a tiny model of the family (tests/bake/test_families_dense.py).

_NO_QKV = dict(q_proj=None, k_proj=None, v_proj=None)
# Every head has its own k/v and head_dim = hidden / heads (a stray head_dim key is not read).
_MHA = dict(num_key_value_heads=None, head_dim=None)
# GPT-2 and its descendants: n_layer, n_head, n_embd, n_inner (null: 4 × n_embd).
_GPT2_KEYS = ConfigKeys("n_layer", "n_head", "n_embd", "n_inner", **_MHA, mlp_ratio=4)
_GPT2 = dict(o_proj="attn.c_proj", **_NO_QKV, qkv_proj="attn.c_attn", gate_proj=None, up_proj="mlp.c_fc",
             down_proj="mlp.c_proj", final_norm="ln_f")
_GPT2_CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
# Checkpoints saved from the base model (the Hub's gpt2, bloom) have no "transformer." prefix.
_GPT_H = ("transformer.h.{layer}.", "h.{layer}.")
_NEOX_MLP = dict(gate_proj=None, up_proj="mlp.dense_h_to_4h", down_proj="mlp.dense_4h_to_h")
_FC_MLP = dict(gate_proj=None, up_proj="fc1", down_proj="fc2")
_FUSED_GATE_UP = dict(gate_proj=None, up_proj=None, gate_up_proj="mlp.gate_up_proj")
# transformers' conversion_mapping.py, "exaone" (the names EXAONE 3.x releases and save_pretrained use)
_EXAONE_RENAMES = (
    (r"^transformer\.wte\.", "model.embed_tokens."), (r"^transformer\.h\.", "model.layers."),
    (r"^transformer\.ln_f\.", "model.norm."), (r"\.attn\.attention\.", ".self_attn."),
    (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."), (r"\.ln_1\.", ".input_layernorm."),
    (r"\.ln_2\.", ".post_attention_layernorm."), (r"\.mlp\.c_fc_0\.", ".mlp.gate_proj."),
    (r"\.mlp\.c_fc_1\.", ".mlp.up_proj."), (r"\.mlp\.c_proj\.", ".mlp.down_proj."),
)

ARCHITECTURES.update({
    # Llama-shaped
    "cohere": Layout(_DECODER, logit_multiplier="logit_scale"),
    "cohere2": Layout(_DECODER, logit_multiplier="logit_scale"),
    "cwm": Layout(_DECODER),
    "doge": Layout(_DECODER),
    "ernie4_5": Layout(_DECODER),
    "exaone": Layout(_DECODER, renames=_EXAONE_RENAMES),
    "exaone4": Layout(_DECODER),
    "granite": Layout(_DECODER, logit_divisor="logits_scaling"),
    "granite_swa": Layout(_DECODER, logit_divisor="logits_scaling"),
    "helium": Layout(_DECODER),
    "hunyuan_v1_dense": Layout(_DECODER),
    "hyperclovax": Layout(_DECODER, logit_multiplier="logits_scaling"),
    "internlm3": Layout(_DECODER),
    "iquestcoder": Layout(_DECODER),
    "ministral": Layout(_DECODER),
    "ministral3": Layout(_DECODER),
    "olmo": Layout(_DECODER),
    "olmo3": Layout(_DECODER),
    "seed_oss": Layout(_DECODER),
    "smollm3": Layout(_DECODER),
    "stablelm": Layout(_DECODER),
    "vaultgemma": Layout(_DECODER, logit_softcap="final_logit_softcapping"),
    # BitNet normalises the MLP's hidden units (ffn_sub_norm) before down_proj: see Layout.prune_inputs.
    "bitnet": Layout(_DECODER, prune_inputs=False),
    "diffllama": Layout(_DECODER, head_refusal=(
        "differential attention pairs its heads (o_proj's input is num_attention_heads / 2 differential "
        "heads of 2 × head_dim); edit its MLP neurons instead")),
    "glm": Layout(_DECODER, **_FUSED_GATE_UP),
    "glm4": Layout(_DECODER, **_FUSED_GATE_UP),
    # Ungated MLPs: up → act → down
    "apertus": Layout(_DECODER, gate_proj=None, prune_inputs=False),  # xIELU(0) ≠ 0
    # the text model of Apertus 1.5, also stored inside its multimodal release (transformers' conversion
    # mapping drops the "language_model." part on load)
    "apertus1p5_text": Layout(_DECODER + ("model.language_model.layers.{layer}.",), gate_proj=None,
                              prune_inputs=False),
    "arcee": Layout(_DECODER, gate_proj=None),
    "jais2": Layout(_DECODER, gate_proj=None),
    "nanochat": Layout(_DECODER, gate_proj=None, up_proj="mlp.fc1", down_proj="mlp.fc2",
                       logit_softcap="final_logit_softcapping"),
    "nemotron": Layout(_DECODER, gate_proj=None),
    "starcoder2": Layout(_DECODER, gate_proj=None, up_proj="mlp.c_fc", down_proj="mlp.c_proj"),
    "phi": Layout(_DECODER, o_proj="self_attn.dense", gate_proj=None, up_proj="mlp.fc1", down_proj="mlp.fc2",
                  final_norm="final_layernorm"),
    "persimmon": Layout(_DECODER, o_proj="self_attn.dense", **_NO_QKV, qkv_proj="self_attn.query_key_value",
                        **_NEOX_MLP, final_norm="final_layernorm", config_keys=ConfigKeys(**_MHA)),
    "gpt_neox": Layout(("gpt_neox.layers.{layer}.",), o_proj="attention.dense", **_NO_QKV,
                       qkv_proj="attention.query_key_value", **_NEOX_MLP, final_norm="final_layer_norm",
                       config_keys=ConfigKeys(**_MHA)),
    "gpt_neox_japanese": Layout(("gpt_neox_japanese.layers.{layer}.",), o_proj="attention.dense", **_NO_QKV,
                                qkv_proj="attention.query_key_value", **_NEOX_MLP, final_norm="final_layer_norm",
                                config_keys=ConfigKeys(intermediate_size=None, **_MHA,
                                                       mlp_ratio="intermediate_multiple_size")),
    "opt": Layout(("model.decoder.layers.{layer}.", "decoder.layers.{layer}."), o_proj="self_attn.out_proj",
                  **_FC_MLP, final_norm="final_layer_norm",
                  config_keys=ConfigKeys(intermediate_size="ffn_dim", **_MHA)),
    "biogpt": Layout(("biogpt.layers.{layer}.",), o_proj="self_attn.out_proj", **_FC_MLP, final_norm="layer_norm",
                     config_keys=ConfigKeys(**_MHA)),
    "xglm": Layout(("model.layers.{layer}.",), o_proj="self_attn.out_proj", **_FC_MLP, final_norm="layer_norm",
                   config_keys=ConfigKeys("num_layers", "attention_heads", "d_model", "ffn_dim", **_MHA)),
    "gptj": Layout(("transformer.h.{layer}.",), o_proj="attn.out_proj", q_proj="attn.q_proj", k_proj="attn.k_proj",
                   v_proj="attn.v_proj", gate_proj=None, up_proj="mlp.fc_in", down_proj="mlp.fc_out",
                   final_norm="ln_f", config_keys=_GPT2_KEYS),
    "codegen": Layout(("transformer.h.{layer}.",), o_proj="attn.out_proj", **_NO_QKV, qkv_proj="attn.qkv_proj",
                      gate_proj=None, up_proj="mlp.fc_in", down_proj="mlp.fc_out", final_norm="ln_f",
                      config_keys=_GPT2_KEYS),
    "gpt_neo": Layout(("transformer.h.{layer}.",), o_proj="attn.attention.out_proj", q_proj="attn.attention.q_proj",
                      k_proj="attn.attention.k_proj", v_proj="attn.attention.v_proj", gate_proj=None,
                      up_proj="mlp.c_fc", down_proj="mlp.c_proj", final_norm="ln_f",
                      config_keys=ConfigKeys("num_layers", "num_heads", **_MHA, mlp_ratio=4)),
    "bloom": Layout(_GPT_H, o_proj="self_attention.dense", **_NO_QKV, qkv_proj="self_attention.query_key_value",
                    **_NEOX_MLP, final_norm="ln_f",
                    config_keys=ConfigKeys("n_layer", "n_head", intermediate_size=None, **_MHA, mlp_ratio=4)),
    "falcon": Layout(("transformer.h.{layer}.",), o_proj="self_attention.dense", **_NO_QKV,
                     qkv_proj="self_attention.query_key_value", **_NEOX_MLP, final_norm="ln_f",
                     config_keys=ConfigKeys(intermediate_size="ffn_hidden_size", **_MHA, mlp_ratio=4, kv_heads_when=(
                         ("new_decoder_architecture", "num_kv_heads"), ("multi_query", 1)))),
    "mpt": Layout(("transformer.blocks.{layer}.",), o_proj="attn.out_proj", **_NO_QKV, qkv_proj="attn.Wqkv",
                  gate_proj=None, up_proj="ffn.up_proj", down_proj="ffn.down_proj", final_norm="norm_f",
                  config_keys=ConfigKeys("n_layers", "n_heads", "d_model", None, **_MHA, mlp_ratio="expansion_ratio")),
    "ctrl": Layout(("transformer.h.{layer}.",), o_proj="multi_head_attention.dense", q_proj="multi_head_attention.Wq",
                   k_proj="multi_head_attention.Wk", v_proj="multi_head_attention.Wv", gate_proj=None,
                   up_proj="ffn.0", down_proj="ffn.2", final_norm="layernorm",
                   config_keys=ConfigKeys("n_layer", "n_head", "n_embd", "dff", **_MHA)),
    "modernbert-decoder": Layout(_DECODER, o_proj="attn.Wo", q_proj="attn.q_proj", k_proj="attn.k_proj",
                                 v_proj="attn.v_proj", down_proj="mlp.Wo", gate_proj=None, up_proj=None,
                                 gate_up_proj="mlp.Wi", final_norm="final_norm", pre_head="lm_head",
                                 config_keys=ConfigKeys(**_MHA)),
    "cpmant": Layout(("cpmant.encoder.layers.{layer}.",), o_proj="self_att.self_attention.attention_out",
                     q_proj="self_att.self_attention.project_q", k_proj="self_att.self_attention.project_k",
                     v_proj="self_att.self_attention.project_v", gate_proj="ffn.ffn.w_in.w_0",
                     up_proj="ffn.ffn.w_in.w_1", down_proj="ffn.ffn.w_out", final_norm="output_layernorm",
                     config_keys=ConfigKeys(intermediate_size="dim_ff", num_key_value_heads=None, head_dim="dim_head")),
    # GPT-2's Conv1D: weights stored [in, out]
    "gpt2": Layout(_GPT_H, **_GPT2, conv1d=_GPT2_CONV1D, config_keys=_GPT2_KEYS),
    "openai-gpt": Layout(_GPT_H, **{**_GPT2, "final_norm": None}, conv1d=_GPT2_CONV1D,
                         config_keys=ConfigKeys("n_layer", "n_head", "n_embd", None, **_MHA, mlp_ratio=4)),
    # GPT-BigCode: GPT-2's names on nn.Linear, one k/v head under multi_query
    "gpt_bigcode": Layout(("transformer.h.{layer}.",), **_GPT2, config_keys=ConfigKeys(
        "n_layer", "n_head", "n_embd", "n_inner", **_MHA, mlp_ratio=4, kv_heads_when=(("multi_query", 1),))),
    # Cohere's parallel attention and MLP block, as the text model of Cohere's Compass (North) vision models
    "cohere_compass_text": Layout(_DECODER, logit_multiplier="logit_scale"),
})
# GPT-SW3 releases are GPT-2 models (transformers maps the type to GPT2Config and GPT2LMHeadModel).
ARCHITECTURES["gpt-sw3"] = ARCHITECTURES["gpt2"]
# Fuyu: a Persimmon decoder reading image patches projected into its embeddings (no vision tower)
ARCHITECTURES["fuyu"] = _wrapper("persimmon")

TABLE_LOCATION = "surgery/core/architectures.py (the ARCHITECTURES table)"

# --- coverage (issue 24) ---
# The causal-LM model types of transformers that surgery refuses, each with the reason that
# architecture() gives in its one line. Every causal-LM type of the installed transformers is a row
# of ARCHITECTURES or a key here (tests/core/test_coverage.py fails naming any other).
_ENCODER = ("a BERT-style bidirectional encoder with a language-model head (transformers runs it causally "
            "with is_decoder=True), not a decoder-only LM")
_SEQ2SEQ = "the decoder of an encoder-decoder model (its layers cross-attend to the encoder's output)"
_MAMBA = "Mamba layers only: no attention heads, and no MLP (the mixer gates a selective state-space scan)"
_DRAFTER = ("a speculative-decoding drafter: it runs only on its target model's embeddings and key/value "
            "states (inputs_embeds, shared_kv_states), not on token ids")
_DOTS3 = ("its layers mix MLA (indexed attention) and plain attention with different head sizes, and the number "
          "of routed experts differs per layer (pyramid_num_routed; the table has one per model)")
REFUSED: dict[str, str] = {
    "mllama": ("its decoder interleaves cross-attention layers (cross_attention_layers, attending to the image) "
               "with its self-attention layers, and the table has no layer kind for them yet"),
    "moshi": ("a speech model: its causal LM is one stream of a model with audio codebooks and a depth decoder "
              "whose projections are per-codebook; not described by the table yet"),
    "emu3": ("its releases are the image-and-text generation model (text layers under model.text_model, a VQ-VAE "
             "image tokenizer beside them): not described by the table yet"),
    "gemma3n_text": ("AltUp keeps several residual streams per layer (altup, laurel, per-layer inputs) and the "
                     "first layers' MLPs are activation-sparse (a top-k over every neuron): not described by the "
                     "table yet"),
    "gemma3n": "its text model is gemma3n_text (AltUp streams, activation-sparse MLPs): not described by the table yet",
    "dory": "its releases store each decoder layer as two blocks (layers.2i attention, layers.2i+1 MLP) that "
            "transformers collapses on load: the stored layers are not the model's",
    **dict.fromkeys(("bert", "bert-generation", "big_bird", "camembert", "data2vec-text", "electra", "ernie",
                     "megatron-bert", "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer",
                     "xlm-roberta", "xlm-roberta-xl", "xmod"), _ENCODER),
    **dict.fromkeys(("bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp",
                     "pegasus", "plbart", "prophetnet", "trocr", "whisper"), _SEQ2SEQ),
    **dict.fromkeys(("mamba", "mamba2", "falcon_mamba"), _MAMBA),
    **dict.fromkeys(("gemma4_assistant", "gemma4_unified_assistant"), _DRAFTER),
    "musicgen": "an audio-code decoder (MusicGen): it predicts several codebooks at once, cross-attending to a "
                "text encoder, not a text causal LM",
    "musicgen_melody": "an audio-code decoder (MusicGen Melody): it predicts several codebooks at once from "
                       "prepended audio and text conditioning, not a text causal LM",
    "rwkv": "RWKV layers: time mixing in place of attention (no heads) and a receptance-gated channel mix",
    "xlstm": "xLSTM layers: mLSTM recurrent cells in place of attention (no heads); neuron-only editing of its "
             "feed-forward blocks is not implemented",
    "xlm": "XLM: a masked-LM encoder (causal only as a pretraining option) whose attention and feed-forward blocks "
           "are separate module lists, not decoder layers",
    "xlnet": "XLNet: a permutation language model with two-stream relative attention, not a causal decoder",
    "reformer": "Reformer: reversible layers (two residual streams) with LSH and chunked local attention",
    "git": "GIT: its text layers are a BERT-style encoder over image and text tokens (git.encoder.layer), not a "
           "decoder-only LM",
    "blt": "Byte Latent Transformer: three stacks of layers (local encoder, global transformer, local decoder) "
           "joined by cross-attention, so a layer index names no single layer",
    "hrm_text": "Hierarchical Reasoning Model: two stacks of layers (H_module, L_module) run in nested cycles, so "
                "a layer index names no single layer",
    # hybrid layers sharing one block, and mixed attention shapes (the MLA, DeepSeek-V4 and hybrid rows' section)
    "zamba": "its attention and MLP are one shared block reused by every hybrid layer: an edit of one layer "
             "would edit them all",
    "zamba2": "its attention and MLP blocks are shared across hybrid layers (with per-layer adapters): an edit "
              "of one layer would edit every layer sharing the block",
    **dict.fromkeys(("dots3_note", "dots3_note_text"), _DOTS3),
    # --- MoE variants (issue 24) ---
    "dbrx": ("its experts are DBRX's own GLU (w1/v1/w2 stacked [E·I, H]) run by a custom forward, and its "
             "attention is one fused Wqkv under transformer.blocks: neither is in the table yet"),
    "jetmoe": ("its attention is itself a mixture of experts (MoA: each token's heads come from routed expert "
               "projections), so no fixed columns carry a head; its MLP experts run a custom dispatch"),
    "longcat_flash": ("each layer has two attention blocks, two dense MLPs and zero-computation experts "
                      "(self_attn.0/1, mlps.0/1): a layer's neurons and heads have no single site to name"),
    "inkling_text": ("short convolutions wrap its attention inputs and its experts (attn_sconv, k/v_sconv, "
                     "mlp_sconv): not described by the table yet"),
    "inkling2_text": ("its attention projections are wrapped in short convolutions and its layers read "
                      "learned residual queries (attention_input, mlp_input): not described by the table yet"),
    "inkling2_loop_text": ("a looped Inkling-2 (layers re-run with message gates between passes): one weight "
                           "serves several passes, so an edit's site is not one layer"),
}


def refusal(config: Mapping[str, Any]) -> str | None:
    """Why the table cannot edit a model of this config (one line), or None when it can.

    Read from config.json alone: an unknown or refused model_type, or a wrapper whose text model
    is not the decoder its row describes.
    """
    model_type = str(config.get("model_type"))
    layout = ARCHITECTURES.get(model_type)
    if layout is None and model_type in REFUSED:
        return f"model_type '{model_type}' is not supported: {REFUSED[model_type]}"
    if layout is None:
        return (f"model_type '{model_type}' is not supported (supported: {', '.join(sorted(ARCHITECTURES))}); "
                f"to add it, extend {TABLE_LOCATION}")
    text_type = text_config(config).get("model_type")
    if layout.text_model_types and text_type is not None and text_type not in layout.text_model_types:
        return (f"{model_type}: its text_config has model_type '{text_type}', but the table's {model_type} row "
                f"describes a {' or '.join(layout.text_model_types)} text decoder; extend {TABLE_LOCATION}")
    return None


def model_class(model_type: str) -> str:
    """The transformers auto class that loads a whole ``model_type`` checkpoint (for a wrapper, with
    its other towers)."""
    layout = ARCHITECTURES.get(model_type)
    return layout.model_class if layout else "AutoModelForCausalLM"


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
    # Layers whose sizes differ from the ones above, as layer → ((field, value), …), and the attention
    # inputs a layer lacks, as layer → ("k_proj", "v_proj") (empty: every layer is alike).
    layer_sizes: tuple[tuple[int, tuple[tuple[str, int], ...]], ...] = ()
    layer_absent: tuple[tuple[int, tuple[str, ...]], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; a dense model's dict has only the dense fields (findings written before MoE
        support record exactly those, and must still match)."""
        out = {k: v for k, v in self.__dict__.items() if k not in _MOE_FIELDS + _SHAPE_FIELDS + _LAYER_FIELDS}
        if self.num_experts:
            out.update(num_experts=self.num_experts, expert_size=self.expert_size,
                       shared_size=self.shared_size, sparse_layers=sorted(self.sparse_layers))
        # the same for the fields of issue 24: present only where the model has them
        for k in _SHAPE_FIELDS:
            if v := getattr(self, k):
                out[k] = dict(v.__dict__) if isinstance(v, MlaSizes) else list(v) if isinstance(v, tuple) else v
        if self.layer_sizes or self.layer_absent:
            out.update(layer_sizes={str(i): dict(f) for i, f in self.layer_sizes},
                       layer_absent={str(i): list(m) for i, m in self.layer_absent})
        return out

    def at(self, layer: int) -> "Geometry":
        """The sizes of decoder layer ``layer``."""
        return replace(self, **dict(dict(self.layer_sizes).get(layer, ())), layer_sizes=(), layer_absent=())


_MOE_FIELDS = ("num_experts", "expert_size", "shared_size", "sparse_layers")
_SHAPE_FIELDS = ("mla", "layer_kinds", "mlp_kinds", "o_groups", "o_rank")
_LAYER_FIELDS = ("layer_sizes", "layer_absent")


@dataclass(frozen=True)
class Architecture:
    """A supported model: its layout and its geometry."""

    model_type: str
    layout: Layout
    geometry: Geometry

    def loaded_names(self, names: Iterable[str]) -> dict[str, str]:
        """Each stored name of ``names`` under the name the loaded model gives it (``renames``)."""
        out = {}
        for name in names:
            loaded = name
            for pattern, replacement in self.layout.renames:
                loaded = re.sub(pattern, replacement, loaded, count=1)
            out[loaded] = name
        return out

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
        g, lay, keys = self.geometry, self.layout, self.layout.config_keys
        if lay.head_refusal:  # no head edits: the table knows no head layout to check the shapes by
            return {}
        if lay.mla or lay.grouped_output:
            return mla_shapes(self) if lay.mla else grouped_output_shapes(self)
        q_rows, kv_rows = g.num_heads * g.head_dim, g.num_kv_heads * g.head_dim
        # the family's own config keys, so that the message names the fields to correct
        heads, dim = keys.num_attention_heads, keys.head_dim or f"({keys.hidden_size} / {keys.num_attention_heads})"
        kv_heads = keys.num_key_value_heads or (
            f"k/v heads (set by {', '.join(flag for flag, _ in keys.kv_heads_when)})" if keys.kv_heads_when else heads)
        q = f"{heads} × {dim} = {g.num_heads} × {g.head_dim}"
        kv = f"{kv_heads} × {dim} = {g.num_kv_heads} × {g.head_dim}"

        def side(module: str, out: bool) -> str:  # the stored side of the [out, in] map's out/in features
            return "rows" if out != self.stored_flipped(module) else "columns"

        shapes = {lay.o_proj: ((g.hidden_size, q_rows), f"{q} {side(lay.o_proj, False)}")}
        if lay.q_proj:  # a gated attention's q_proj holds each head's query and gate: twice the rows
            gate = 2 if lay.q_gate else 1
            shapes[lay.q_proj] = ((gate * q_rows, g.hidden_size),
                                  f"{'2 × ' if lay.q_gate else ''}{q} {side(lay.q_proj, True)}")
        for name in (lay.k_proj, lay.v_proj):
            if name:
                shapes[name] = ((kv_rows, g.hidden_size), f"{kv} {side(name, True)}")
        if lay.qkv_proj:
            shapes[lay.qkv_proj] = ((q_rows + 2 * kv_rows, g.hidden_size),
                                    f"({heads} + 2 × {kv_heads}) × {dim} = ({g.num_heads} + 2 × {g.num_kv_heads}) "
                                    f"× {g.head_dim} {side(lay.qkv_proj, True)}")
        return shapes

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
        """``module`` (an in-memory name relative to a layer) as the family's releases store it
        (``Layout.stored_names``; itself where they keep transformers' name)."""
        for loaded, stored in self.layout.stored_names:
            if f"{module}.".startswith(loaded):
                return (stored + f"{module}."[len(loaded):])[:-1]
        return module

    def stored_flipped(self, module: str) -> bool:
        """Whether ``module``'s weight is stored [in, out] (a Conv1D) instead of [out, in]."""
        return module in self.layout.conv1d

    def stored_shape(self, module: str, shape: tuple[int, int]) -> tuple[int, int]:
        """The stored shape of ``module``'s weight, whose [out, in] shape is ``shape``."""
        return (shape[1], shape[0]) if self.stored_flipped(module) else shape

    def layer_kind(self, layer: int) -> str | None:
        """The kind of ``layer`` in a hybrid model ("full_attention", "linear_attention", …); None: not hybrid."""
        kinds = self.geometry.layer_kinds
        return kinds[layer] if kinds else None

    def head_layers(self) -> tuple[int, ...]:
        """The layers with attention heads at o_proj (all but a hybrid model's other kinds)."""
        lk, n = self.layout.layer_kinds, self.geometry.num_layers
        if self.layout.head_refusal:
            return ()
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

    def at(self, layer: int) -> "Architecture":
        """The architecture as decoder layer ``layer`` has it: that layer's sizes, and no attention
        inputs it lacks (a row whose layers are all alike is itself)."""
        g = self.geometry
        if not (g.layer_sizes or g.layer_absent):
            return self
        absent = dict(g.layer_absent).get(layer, ())
        return Architecture(self.model_type, replace(self.layout, **dict.fromkeys(absent)), g.at(layer))

    def kind_name(self, layer: int) -> str:
        """A hybrid model's kind of ``layer``: its attention side's and its MLP side's, once where one
        list says both (Nemotron-H), e.g. "linear_attention + sparse"; "" for a model whose layers are alike."""
        g, mlp = self.geometry, None
        if g.mlp_kinds:
            mlp = g.mlp_kinds[layer]
        elif g.layer_kinds and self.layout.experts:  # a hybrid mixture of experts: which MLP the layer has
            mlp = "sparse" if self.is_sparse(layer) else "dense"
        return " + ".join(dict.fromkeys(k for k in (self.layer_kind(layer), mlp) if k))

    def refused_parts(self, layer: int) -> tuple[str, ...]:
        """What a hybrid model's ``layer`` holds that surgery does not edit, each with its reason
        (:data:`KIND_REFUSALS`): heads outside the row's attention kinds, experts the row does not describe."""
        g, why = self.geometry, []
        if self.layout.head_refusal:
            why.append(f"heads ({self.layout.head_refusal})")
        elif g.layer_kinds and layer not in self.head_layers():
            why.append(KIND_REFUSALS.get(("heads", g.layer_kinds[layer])))
        if g.mlp_kinds and layer not in self.dense_mlp_layers() and not self.is_sparse(layer):
            why.append(KIND_REFUSALS.get(("mlp", g.mlp_kinds[layer])))
        return tuple(dict.fromkeys(w for w in why if w))

    def layer_edits(self, layer: int) -> "LayerEdits":
        """What decoder layer ``layer`` lets an edit touch, at its own sizes, and what it holds that
        surgery refuses (read from the config: no weights)."""
        g = self.at(layer).geometry
        heads = g.num_heads if layer in self.head_layers() else 0
        neurons = g.intermediate_size if layer in self.dense_mlp_layers() else 0
        experts = (g.num_experts, g.expert_size, g.shared_size) if self.is_sparse(layer) else (0, 0, 0)
        return LayerEdits(heads, neurons, *experts, refused=self.refused_parts(layer), kind=self.kind_name(layer))

    def layer_kinds(self) -> list[tuple[tuple[int, ...], "LayerEdits"]]:
        """The layers grouped by what they let an edit touch, in the order each kind first occurs."""
        kinds: dict[LayerEdits, list[int]] = {}
        for layer in range(self.geometry.num_layers):
            kinds.setdefault(self.layer_edits(layer), []).append(layer)
        return [(tuple(layers), kind) for kind, layers in kinds.items()]


@dataclass(frozen=True)
class LayerEdits:
    """What one decoder layer lets an edit touch: ``heads`` attention heads, ``neurons`` dense MLP
    neurons, ``experts`` routed experts of ``expert_width`` neurons each and a shared expert of
    ``shared_width`` neurons (0: the layer has none); ``refused`` names what the layer holds that
    surgery does not edit, each with its reason; ``kind``: a hybrid model's kind of layer."""

    heads: int
    neurons: int
    experts: int = 0
    expert_width: int = 0
    shared_width: int = 0
    refused: tuple[str, ...] = ()
    kind: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: only what the layer has (and what it refuses)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items() if v}

    def text(self) -> str:
        """One line, e.g. "4 heads; 4 experts × 16 neurons; shared expert: 24 neurons", or "nothing;
        refused: …" for a layer an edit cannot touch."""
        parts = [f"{self.heads} heads"] if self.heads else []
        if self.neurons:
            parts.append(f"{self.neurons} MLP neurons")
        if self.experts:
            parts.append(f"{self.experts} experts × {self.expert_width} neurons")
        if self.shared_width:
            parts.append(f"shared expert: {self.shared_width} neurons")
        return "; ".join((parts or ["nothing"]) + [f"refused: {why}" for why in self.refused])


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
    key = layout.config_keys.num_hidden_layers
    if key not in cfg and layout.layer_kinds:
        for rule in layout.layer_kinds.rules:
            if rule.form in ("list", "pattern") and isinstance(kinds := _lookup(cfg, rule.keys[0]), (list, str)):
                return len(kinds)
    return need(key)


def _mlp_width(layout: Layout, cfg: Mapping[str, Any], hidden: int, need, key: str | None) -> int:
    """The dense MLP's width: the config's ``key`` (intermediate_size), hidden_size ×
    ``ConfigKeys.mlp_ratio`` where the key is absent or null, or what ``Layout.ffn_adjust`` derives from it."""
    ratio = layout.config_keys.mlp_ratio
    if key and (cfg.get(key) is not None or ratio is None):
        width = need(key)
    else:
        width = (ratio if isinstance(ratio, int) else need(ratio)) * hidden
    width //= layout.ffn_divisor
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
    keys = ARCHITECTURES[model_type].config_keys

    def need(key: str) -> int:
        if not isinstance(cfg.get(key), int):
            raise UnsupportedArchitecture(
                f"config.json of this {model_type} model has no integer '{key}'; "
                "is it a complete transformers config?"
            )
        return int(cfg[key])

    layout = ARCHITECTURES[model_type]
    heads = need(keys.num_attention_heads)
    hidden = need(keys.hidden_size)
    layers = _num_layers(layout, cfg, need)
    # head_dim is explicit in Gemma/Qwen3 configs and differs from hidden/heads there.
    head_dim = (cfg.get(keys.head_dim) if keys.head_dim else None) or hidden // heads
    ex = layout.experts
    if ex and ex.aliases:  # an old spelling stands for the key when the key itself is absent
        cfg = {**{key: cfg[alias] for alias, key in ex.aliases if alias in cfg}, **cfg}
    size_keys = ex.dense_size_keys if ex else (keys.intermediate_size,)
    dense_key = next((k for k in size_keys if k and cfg.get(k) is not None), size_keys[0]) if size_keys else None
    has_dense = (dense_key or keys.mlp_ratio) and (layout.mlp_kinds is None or layout.mlp_kinds.editable)
    dense = _issue24_geometry(layout, model_type, cfg, Geometry(
        layers, heads, _kv_heads(keys, cfg, heads, need), int(head_dim), hidden,
        _mlp_width(layout, cfg, hidden, need, dense_key) if has_dense else 0), need)
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


def _kv_heads(keys: ConfigKeys, cfg: Mapping[str, Any], heads: int, need: Callable[[str], int]) -> int:
    """The number of k/v heads: set by a flag of ``kv_heads_when``, else its key, else one per head."""
    for flag, source in keys.kv_heads_when:
        if cfg.get(flag):
            return source if isinstance(source, int) else need(source)
    return int((cfg.get(keys.num_key_value_heads) if keys.num_key_value_heads else None) or heads)


def architecture(config: Mapping[str, Any]) -> Architecture:
    """Look up a config dict (config.json) in the table; a refused family is one line saying why."""
    why = refusal(config)
    if why:
        raise UnsupportedArchitecture(why)
    model_type = str(config.get("model_type"))
    layout, cfg = ARCHITECTURES[model_type], text_config(config)
    return Architecture(model_type, layout, _per_layer(layout, cfg, _geometry(model_type, cfg)))


# transformers' per_layer_config keys → the Geometry fields they set for one layer.
_PER_LAYER_FIELDS = {"head_dim": "head_dim", "num_key_value_heads": "num_kv_heads",
                     "num_attention_heads": "num_heads", "intermediate_size": "intermediate_size"}


def _per_layer(layout: Layout, cfg: Mapping[str, Any], g: Geometry) -> Geometry:
    """``g`` with the layers that differ: transformers' ``per_layer_config`` (layer → the sizes it
    overrides) and the row's :class:`LayerSizes` rules."""
    sizes = {int(layer): {field: int(over[key]) for key, field in _PER_LAYER_FIELDS.items() if key in over}
             for layer, over in (cfg.get("per_layer_config") or {}).items()}
    absent: dict[int, tuple[str, ...]] = {}
    rules, n = layout.layer_sizes, g.num_layers
    if rules is not None:
        shared = int(cfg.get(rules.kv_shared_key) or 0) if rules.kv_shared_key else 0
        for layer in range(n - shared, n):  # transformers: layers from n − shared on reuse keys and values
            absent[layer] = ("k_proj", "v_proj")
            if rules.double_wide_key and cfg.get(rules.double_wide_key):
                sizes.setdefault(layer, {})["intermediate_size"] = 2 * g.intermediate_size
        if rules.k_eq_v_key and cfg.get(rules.k_eq_v_key):
            for layer, kind in enumerate((cfg.get("layer_types") or [])[:n]):
                if kind != "sliding_attention" and layer not in absent:
                    absent[layer] = ("v_proj",)
    return replace(g, layer_sizes=tuple((i, tuple(sorted(f.items()))) for i, f in sorted(sizes.items()) if f),
                   layer_absent=tuple(sorted(absent.items())))
