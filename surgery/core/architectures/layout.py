"""The table's row type: ``Layout``, one row of the table, made of typed parts grouped by meaning
(where the layers live, attention, MLP, experts, hybrid layers, the tail, the limits, config.json).

Data only (the table itself: :mod:`.table`). Every field has a docstring after it (PEP 257 attribute
docstrings): docs/generate.py writes the field table of docs/contributing/adding-an-architecture.md
from them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .experts import Experts
from .kinds import GroupedOutput, LayerKinds, Mla
from .records import ConfigKeys, LayerSizes, Mixer, NativeName

# Where a message tells the user to add a row or a refusal.
TABLE_LOCATION = "surgery/core/architectures/ (the ARCHITECTURES table)"


@dataclass(frozen=True)
class Names:
    """Where the decoder layers live, and how checkpoints spell names other than the loaded model's."""

    layer_prefixes: tuple[str, ...] = ("model.layers.{layer}.",)
    """Every spelling of the decoder-layer prefix met in real checkpoints (``{layer}`` is the index).
    Multimodal wrappers were saved under different prefixes by different transformers versions; the
    spelling a checkpoint or a loaded model actually contains is chosen by
    ``Architecture.layer_prefix``, never guessed."""
    embeddings: str | None = "embed_tokens"
    """The token embedding table [vocab, hidden], a sibling of the layer list (None: it is not one;
    direction edits of the embeddings are refused)."""
    stored_names: tuple[tuple[str, str], ...] = ()
    """Modules (relative to a layer, or to the layer list's parent for the embeddings) stored on disk
    under another name than the loaded model's, as transformers' checkpoint conversion mapping renames
    them: (loaded, stored) name prefixes, e.g. DeepSeek-V4's ("self_attn.o_a_proj", "attn.wo_a"),
    Ling's ("self_attn.", "attention."); a checkpoint may hold either spelling (a re-save under the
    loaded names)."""
    renames: tuple[tuple[str, str], ...] = ()
    """transformers' checkpoint conversion renames of this family (conversion_mapping.py), as (on-disk
    regex, loaded replacement) in its order: save_pretrained writes the on-disk names (EXAONE's
    transformer.h.N.attn.attention.out_proj), the loaded model has the others. A test compares them
    with transformers' mapping."""
    native_names: tuple[NativeName, ...] = ()
    """The release's native tensor names (a second copy of the weights some releases ship next to the
    transformers ones, e.g. Mistral's consolidated.safetensors): see NativeName."""
    conv1d: tuple[str, ...] = ()
    """Modules that are transformers' Conv1D (GPT-2): the weight is stored [in, out], so a column of
    the [out, in] map is a stored row. Sites keep the [out, in] view; the resolver flips them."""


@dataclass(frozen=True)
class Attention:
    """The attention's matrices, relative to a layer: a head is its columns of ``o_proj``."""

    o_proj: str = "self_attn.o_proj"
    """The attention output projection: head h is its input columns h·d … (h+1)·d."""
    q_proj: str | None = "self_attn.q_proj"
    """The query projection, checked against the config's head counts before any edit (a config whose
    heads fit o_proj but not q/k/v would otherwise only fail inside transformers' loader); None: fused
    or computed otherwise."""
    k_proj: str | None = "self_attn.k_proj"
    """The key projection, checked like ``q_proj``; None: fused or absent."""
    v_proj: str | None = "self_attn.v_proj"
    """The value projection, checked like ``q_proj``; None: fused or absent."""
    qkv_proj: str | None = None
    """Fused q/k/v (Phi-3): one ((heads + 2 kv_heads) × head_dim, H) matrix."""
    q_gate: bool = False
    """Gated attention (Qwen3-Next, Qwen3.5): q_proj's rows hold each head's query and its output gate."""
    mla: Mla | None = None
    """Multi-head latent attention: o_proj's input is num_heads × v_head_dim; q/kv through low-rank pairs."""
    grouped_output: GroupedOutput | None = None
    """DeepSeek-V4's grouped low-rank output: a head is a block of o_proj (= o_a_proj) within its
    group's rows."""


@dataclass(frozen=True)
class Mlp:
    """The dense MLP's matrices, relative to a layer: a neuron is its column of ``down_proj``."""

    down_proj: str = "mlp.down_proj"
    """The MLP output: neuron i is its input column i."""
    gate_proj: str | None = "mlp.gate_proj"
    """The MLP's gate input: a pruned neuron's row is zeroed in it (None: ungated, or fused)."""
    up_proj: str | None = "mlp.up_proj"
    """The MLP's up input: a pruned neuron's row is zeroed in it (None: fused)."""
    gate_up_proj: str | None = None
    """Fused gate/up (Phi-3): one (2I, H) matrix, gate rows [0:I], up rows [I:2I]."""
    ffn_adjust: tuple[str, str, str] | None = None
    """An MLP whose width the model derives from intermediate_size (LFM2, as Meta's Llama code did): the
    config keys of (the switch, the multiplier, the multiple): width = 2·I/3, × multiplier, rounded up."""
    ffn_divisor: int = 1
    """An MLP narrower than intermediate_size by this factor (RecurrentGemma's is intermediate_size // 2)."""
    prune_inputs: bool = True
    """Whether a pruned neuron's MLP input rows are zeroed too. The down_proj column alone is the exact
    edit; zero input rows make the neuron dead in the weights as well, but only where act(0) = 0 and
    nothing else reads those rows: not with xIELU (act(0) ≠ 0), nor where a norm over the MLP's hidden
    units (BitNet's ffn_sub_norm), or a cut computed over them (Gemma 3n's activation-sparse layers:
    mean + k·std of the gate), would see the zeros and change every other neuron."""


@dataclass(frozen=True)
class Layers:
    """What each decoder layer holds where the layers differ (hybrid models, per-layer sizes, blocks)."""

    layer_kinds: LayerKinds | None = None
    """Hybrid models: which layers have attention heads at o_proj (the others: linear attention,
    state-space, convolution…); None: every layer has them."""
    mlp_kinds: LayerKinds | None = None
    """Which layers have a dense MLP; None: every layer has one (or its experts)."""
    mixer: Mixer | None = None
    """The output projection of the layers' other token mixer (Mamba, linear attention, a short
    convolution): a residual writer a direction is projected through; None: the row has none."""
    layer_sizes: LayerSizes | None = None
    """Layers that lack attention inputs or have a wider MLP than the config's top level says (Gemma 4)."""
    sub_layers: int = 1
    """Attention blocks per decoder layer, each followed by its dense MLP (LongCat-Flash: 2, ModuleLists
    self_attn and mlps). The table's layers are then these sub-layers, numbered as transformers numbers
    their attention (block i of decoder layer L is layer sub_layers·L + i, its cache index), and "{sub}"
    in a module name stands for the block (self_attn.{sub}.o_proj): Architecture.block."""


@dataclass(frozen=True)
class Tail:
    """What the model does after its decoder layers: a knockout pass resumed at layer L runs it itself."""

    final_norm: str | None = "norm"
    """The final norm, a sibling of the layer list (None: none, GPT-1 is post-norm)."""
    final_head: str | None = None
    """A module the model applies before its final norm (the hyper-connection head that merges
    DeepSeek-V4's residual streams)."""
    pre_head: str | None = None
    """A module of the causal LM between the final norm and the output embeddings (ModernBERT's
    prediction head, "lm_head": dense, activation, norm); None: none."""
    logit_scaling: str | None = None
    """The config attribute the last hidden states are divided by before lm_head (MiniCPM3's
    logits_scaling)."""
    logit_multiplier: str | None = None
    """The config key logits are multiplied by after lm_head (Cohere's logit_scale, HyperCLOVA X's
    logits_scaling)."""
    logit_divisor: str | None = None
    """The config key logits are divided by after lm_head (Granite's logits_scaling)."""
    logit_softcap: str | None = None
    """The config field of a final logit soft-cap (Gemma-2's final_logit_softcapping)."""


@dataclass(frozen=True)
class Limits:
    """What surgery cannot do on this family, each with its reason, and what find-heads' passes need."""

    head_refusal: str | None = None
    """Why head edits are refused on this family (None: heads are the o_proj input columns of the head
    layers), e.g. DiffLlama's differential head pairs (its o_proj columns are not num_heads heads of
    head_dim): the attention shapes are then not checked either (no head layout to check them by)."""
    find_heads_refusal: str | None = None
    """Why find-heads cannot replay this family's forward pass, where heads are still editable by name."""
    find_refusal: str | None = None
    """Why no finder (find-heads, find-neurons, find-direction) can run on this family, whose passes read
    and resume whole decoder layers; None: they can."""
    kv_cache: bool = True
    """Whether the model's cache is one key/value pair per layer and nothing else: find-heads' shared
    prefixes and resumed passes slice it (a state-space, compressed or indexer cache is not)."""
    token_keys: bool = True
    """Whether attention reads the prompt's tokens as its keys and nothing else (DeepSeek-V4 also reads
    compressed blocks of them): find-heads' per-token binding features and edge knockouts need it."""


@dataclass(frozen=True)
class Config:
    """How config.json describes the model, and which class loads it (a multimodal wrapper's text model)."""

    keys: ConfigKeys = ConfigKeys()
    """How config.json spells the sizes (GPT-2's n_layer, n_head, n_embd, n_inner …): see ConfigKeys."""
    text_config_key: str | None = None
    """The key of config.json that holds the text model's settings (multimodal wrappers: text_config)."""
    text_model_types: tuple[str, ...] = ()
    """A multimodal wrapper: the model types its text_config may name (the text decoder this row
    describes); empty: not a wrapper."""
    model_class: str = "AutoModelForCausalLM"
    """The transformers auto class that loads the whole model (a wrapper that AutoModelForCausalLM does
    not map, e.g. Mistral-3, loads as image-text-to-text)."""


@dataclass(frozen=True)
class Layout:
    """Where one architecture keeps the pieces we edit, relative to a decoder layer: its parts.

    Every part defaults to a Llama-shaped decoder, so a row names only what differs.
    """

    names: Names = Names()
    """Where the layers live and how checkpoints spell names: see Names."""
    attention: Attention = Attention()
    """The attention's matrices: see Attention."""
    mlp: Mlp = Mlp()
    """The dense MLP's matrices: see Mlp."""
    experts: Experts | None = None
    """Mixture-of-experts layers (None: every layer is a dense MLP): see Experts."""
    layers: Layers = Layers()
    """What differs between layers (hybrid kinds, per-layer sizes, blocks): see Layers."""
    tail: Tail = Tail()
    """What runs after the layers: see Tail."""
    limits: Limits = Limits()
    """What is refused on this family, and what find-heads needs: see Limits."""
    config: Config = Config()
    """How config.json describes the model: see Config."""
