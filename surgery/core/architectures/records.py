"""Records a row's parts hold: config.json's spellings of the sizes, a token mixer's output projection,
a release's native tensor names and per-layer size rules (data only)."""

from __future__ import annotations

from dataclasses import dataclass


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
    """The number of decoder layers."""
    num_attention_heads: str = "num_attention_heads"
    """The number of attention (query) heads."""
    hidden_size: str = "hidden_size"
    """The width of the residual stream."""
    intermediate_size: str | None = "intermediate_size"
    """The width of the dense MLP."""
    num_key_value_heads: str | None = "num_key_value_heads"
    """The number of key/value heads (None: every head has its own)."""
    head_dim: str | None = "head_dim"
    """A head's width (None: hidden_size / num_attention_heads)."""
    mlp_ratio: int | str | None = None
    """When the intermediate_size key is absent or null (or the family has none), the MLP is
    hidden_size × this wide: a number (GPT-2's 4 × n_embd) or the key that holds it (MPT's
    expansion_ratio)."""
    kv_heads_when: tuple[tuple[str, int | str], ...] = ()
    """Flags that decide the number of k/v heads, first true one wins: (flag, count or the key that
    holds it). Falcon: new_decoder_architecture → num_kv_heads, multi_query → 1, else every head."""


@dataclass(frozen=True)
class Mixer:
    """The output projection of a token mixer other than softmax attention (a Mamba block, linear
    attention, a short convolution), relative to a layer: it writes the mixer's output into the
    residual stream, so a direction edit projects it (recipe module ``mixer``) as it does o_proj."""

    module: str
    """The projection's name; its weight is [hidden_size, width]."""
    width: tuple[tuple[str, ...], ...]
    """How config.json spells the width, each a product of config keys (a dotted key is nested), in the
    precedence the family's config class gives them: the next is read where a key of one is null
    (Falcon-H1: mamba_d_ssm, else mamba_expand × hidden_size). A key absent from config.json (the
    class's default, not guessed) leaves the mixer unprojected, and every command that would project it
    says so."""
    kinds: tuple[str, ...] | None = ("linear_attention",)
    """The layer kinds that have it (None: every layer, beside its attention: Falcon-H1)."""
    lora_refusal: str | None = None
    """Why its projection has no LoRA adapter (None: it has one)."""


@dataclass(frozen=True)
class NativeName:
    """A tensor name of a release's native format and the transformers name of the same tensor."""

    pattern: str
    """A regex that matches the whole native name."""
    loaded: str
    """Its ``re`` replacement, the transformers name (``\\1`` = the layer)."""
    permuted: bool = False
    """The native rows are in another order than transformers' (Mistral and Meta store wq/wk for
    interleaved RoPE; the conversion permutes them), so the same bytes are not the same rows and no
    byte plan may be carried over to it."""


@dataclass(frozen=True)
class LayerSizes:
    """A family's rules for layers that differ from config.json's top-level sizes (Gemma 4, 3n), each a
    config key. (Per-layer head sizes come from transformers' ``per_layer_config``, read for every
    family.)"""

    kv_shared_key: str | None = None
    """The last this-many layers reuse an earlier layer's keys and values (they have no k_proj, v_proj)."""
    k_eq_v_key: str | None = None
    """Where true, the full-attention layers take their values from k_proj (no v_proj)."""
    double_wide_key: str | None = None
    """Where true, the kv-shared layers' MLP is twice intermediate_size wide."""
    widths_per_layer: bool = False
    """The MLP width key may hold one width per layer (Gemma 3n's intermediate_size list)."""
