"""Per-layer shapes and kinds: MLA, DeepSeek-V4's grouped output, hybrid layer kinds, and how the
kinds are read from a config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import UnsupportedArchitecture


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
    """DeepSeek-V4's grouped low-rank output projection; ``Attention.o_proj`` names its first half, o_a_proj.

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
    per-head attention at ``Attention.o_proj`` (``Layers.layer_kinds``) or with a dense MLP
    (``Layers.mlp_kinds``). Heads of other kinds (linear attention, state-space, convolution) are not
    heads of softmax attention with a per-head output slice: their edits are refused per layer."""

    rules: tuple[KindRule, ...]
    """The ways config.json may say it: the first whose keys config.json has decides."""
    editable: tuple[str, ...]
    """The kinds this row edits (heads, or dense MLP neurons)."""


# Kinds of layers whose cache is keys and values only (transformers' ALLOWED_ATTN_LAYER_TYPES, less
# the recurrent, convolution, compressed and mixed ones).
ATTENTION_KINDS = ("full_attention", "sliding_attention", "chunked_attention")

# transformers' older names of layer kinds (configuration_utils._LEGACY_LAYER_TYPE_REMAP; a test compares).
LEGACY_KINDS = {
    "mamba": "linear_attention",
    "attention": "full_attention",
    "deepseek_sparse_attention": "indexed_attention",
    "qwen_sparse_attention": "indexed_attention",
}


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
            raise UnsupportedArchitecture(
                f"{where}: '{rule.keys[0]}' has {len(seq)} entries but num_hidden_layers "
                f"= {n}; the config contradicts itself"
            )
        return tuple(names.get(k, k) for k in seq)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values if not isinstance(v, (list, type(None)))):
        raise UnsupportedArchitecture(
            f"{where}: {', '.join(repr(k) for k in rule.keys)} must be integers, got {values}"
        )
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
    raise UnsupportedArchitecture(
        f"{where} has no {keys} (what kind each layer is); is it a complete transformers config?"
    )
