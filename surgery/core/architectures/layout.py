"""The table's row types: where a family keeps its heads, neurons and experts, and how its
config.json spells its sizes (data only; the table itself: :mod:`.table`)."""

from __future__ import annotations

from dataclasses import dataclass

from .kinds import GroupedOutput, LayerKinds, Mla  # noqa: F401 (the row fields' types)

# Where a message tells the user to add a row or a refusal.
TABLE_LOCATION = "surgery/core/architectures/ (the ARCHITECTURES table)"


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
    experts: Experts | None = None
    # After the decoder layers (a knockout pass resumed at layer L runs the model's tail itself):
    # the final norm, a sibling of the layer list (None: none, GPT-1 is post-norm), and the config
    # field of a logit soft-cap.
    final_norm: str | None = "norm"
    # The token embedding table [vocab, hidden], a sibling of the layer list like the final norm
    # (None: it is not one; direction edits of the embeddings are refused).
    embeddings: str | None = "embed_tokens"
    logit_softcap: str | None = None
    # The release's native tensor names (a second copy of the weights some releases ship next to
    # the transformers ones, e.g. Mistral's consolidated.safetensors): see NativeName.
    native_names: tuple[NativeName, ...] = ()
    # --- issue 24 (MLA, hybrid layers, DeepSeek-V4): see the section of that name below ---
    # Multi-head latent attention: o_proj's input is num_heads × v_head_dim; q/kv through low-rank pairs.
    mla: Mla | None = None
    # DeepSeek-V4's grouped low-rank output: a head is a block of o_proj (= o_a_proj) within its group's rows.
    grouped_output: GroupedOutput | None = None
    # Hybrid models: which layers have attention heads at o_proj (the others: linear attention,
    # state-space, convolution…), and which have a dense MLP; None: every layer has both.
    layer_kinds: LayerKinds | None = None
    mlp_kinds: LayerKinds | None = None
    # Gated attention (Qwen3-Next, Qwen3.5): q_proj's rows hold each head's query and its output gate.
    q_gate: bool = False
    # Modules (relative to a layer, or to the layer list's parent for the embeddings) stored on disk under
    # another name than the loaded model's, as
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
    layer_sizes: LayerSizes | None = None
    # Why head edits are refused on this family (None: heads are the o_proj input columns of the
    # head layers), e.g. DiffLlama's differential head pairs (its o_proj columns are not num_heads heads
    # of head_dim): the attention shapes are then not checked either (no head layout to check them by).
    head_refusal: str | None = None
    # Why find-heads cannot replay this family's forward pass, where heads are still editable by name.
    find_heads_refusal: str | None = None
    # --- issue 24 (dense families) ---
    # How config.json spells the sizes (GPT-2's n_layer, n_head, n_embd, n_inner …): see ConfigKeys.
    config_keys: ConfigKeys = ConfigKeys()
    # Modules that are transformers' Conv1D (GPT-2): the weight is stored [in, out], so a column of
    # the [out, in] map is a stored row. Sites keep the [out, in] view; the resolver flips them.
    conv1d: tuple[str, ...] = ()
    # Whether a pruned neuron's MLP input rows are zeroed too. The down_proj column alone is the exact
    # edit; zero input rows make the neuron dead in the weights as well, but only where act(0) = 0
    # and nothing else reads those rows: not with xIELU (act(0) ≠ 0), nor where a norm over the MLP's
    # hidden units (BitNet's ffn_sub_norm), or a cut computed over them (Gemma 3n's activation-sparse
    # layers: mean + k·std of the gate), would see the zeros and change every other neuron.
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
    # --- issue 24 (LongCat-Flash) ---
    # Attention blocks per decoder layer, each followed by its dense MLP (LongCat-Flash: 2, ModuleLists
    # self_attn and mlps). The table's layers are then these sub-layers, numbered as transformers numbers
    # their attention (block i of decoder layer L is layer sub_layers·L + i, its cache index), and
    # "{sub}" in a module name stands for the block (self_attn.{sub}.o_proj): Architecture.block.
    sub_layers: int = 1
    # Why no finder (find-heads, find-neurons, find-direction) can run on this family, whose passes
    # read and resume whole decoder layers; None: they can.
    find_refusal: str | None = None
    # --- residual writers ---
    # The output projection of the layers' other token mixer (Mamba, linear attention, a short
    # convolution): a residual writer a direction is projected through; None: the row has none.
    mixer: Mixer | None = None


@dataclass(frozen=True)
class Mixer:
    """The output projection of a token mixer other than softmax attention (a Mamba block, linear
    attention, a short convolution), relative to a layer: it writes the mixer's output into the
    residual stream, so a direction edit projects it (recipe module ``mixer``) as it does o_proj.

    ``kinds``: the layer kinds that have it (None: every layer, beside its attention: Falcon-H1).
    Its weight is [hidden_size, width]; ``width`` lists how config.json spells the width, each a
    product of config keys (a dotted key is nested), in the precedence the family's config class gives
    them: the next is read where a key of one is null (Falcon-H1: mamba_d_ssm, else mamba_expand ×
    hidden_size). A key absent from config.json (the class's default, not guessed) leaves the mixer
    unprojected, and every command that would project it says so.
    ``lora_refusal``: why its projection has no LoRA adapter (None: it has one).
    """

    module: str
    width: tuple[tuple[str, ...], ...]
    kinds: tuple[str, ...] | None = ("linear_attention",)
    lora_refusal: str | None = None


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
    """A family's rules for layers that differ from config.json's top-level sizes (Gemma 4, 3n), each a
    config key: the last ``kv_shared_key`` layers reuse an earlier layer's keys and values (they have
    no k_proj, v_proj); with ``k_eq_v_key`` true the full-attention layers take their values from
    k_proj (no v_proj); with ``double_wide_key`` true the kv-shared layers' MLP is twice
    intermediate_size wide. With ``widths_per_layer`` the MLP width key may hold one width per layer
    (Gemma 3n's intermediate_size list). (Per-layer head sizes come from transformers'
    ``per_layer_config``, read for every family.)"""

    kv_shared_key: str | None = None
    k_eq_v_key: str | None = None
    double_wide_key: str | None = None
    widths_per_layer: bool = False


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

    num_keys: tuple[str, ...]  # config keys for the number of routed experts (first present)
    size_key: str  # config key of one routed expert's intermediate size
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
    # expert is routed, with the router's weights), "dense" (Llama 4: every expert runs on every
    # token, its input already scaled by the router's score, exactly 0 off the token's top-k) or
    # "looped" (LongCat-Flash: its own forward loops over the routed experts, [E, 2I, H] gate/up
    # chunked, [E, H, I] down, without transformers' experts interface).
    dispatch: str = "routed"
    # --- issue 24 (LongCat-Flash) ---
    # The step rule's step where the family has no key for it (LongCat-Flash: 2, its one mixture of
    # experts per decoder layer read in the first of the layer's two sub-layers, see Layout.sub_layers).
    sparse_step: int = 1
    # The config key of the number of zero-computation (identity) experts the router may pick after the
    # routed ones: they have no weights, so an edit naming one is refused.
    zero_key: str | None = None
    # Whether the layers that route keep a dense MLP of their own too, edited as any dense MLP (LongCat-Flash:
    # the first block's MLP reads the experts' input); False: a sparse layer's MLP is its experts.
    with_dense: bool = False
