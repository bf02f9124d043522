"""Sizes read from config.json: layers, heads, widths, experts, MLA ranks, per-layer kinds and sizes."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..errors import UnsupportedArchitecture
from .experts import SparseLayers
from .kinds import _MISSING, MlaSizes, _lookup, read_kinds
from .layout import ConfigKeys, Layout, Mixer
from .table import ARCHITECTURES


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
    # Zero-computation (identity) experts the router may pick after the routed ones (LongCat-Flash).
    zero_experts: int = 0
    # Empty, None or 0 where the row has none: MLA sizes, the kind of each layer (hybrid
    # models: attention side, MLP side), DeepSeek-V4's output groups and their rank.
    mla: MlaSizes | None = None
    layer_kinds: tuple[str, ...] = ()
    mlp_kinds: tuple[str, ...] = ()
    o_groups: int = 0
    o_rank: int = 0
    # The vocabulary (rows of the embedding table); not part of to_dict (findings do not record it).
    vocab_size: int = 0
    # Layers whose sizes differ from the ones above, as layer → ((field, value), …), and the attention
    # inputs a layer lacks, as layer → ("k_proj", "v_proj") (empty: every layer is alike).
    layer_sizes: tuple[tuple[int, tuple[tuple[str, int], ...]], ...] = ()
    layer_absent: tuple[tuple[int, tuple[str, ...]], ...] = ()
    # The input width of the row's other token mixer's output projection (Layers.mixer); 0: none, or
    # config.json does not say. Not part of to_dict, as vocab_size.
    mixer_width: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; a dense model's dict has only the dense fields (the findings of a dense model
        record exactly those, and must still match)."""
        left_out = _MOE_FIELDS + _SHAPE_FIELDS + _LAYER_FIELDS + ("vocab_size", "mixer_width")
        out = {k: v for k, v in self.__dict__.items() if k not in left_out}
        if self.num_experts:
            out.update(
                num_experts=self.num_experts,
                expert_size=self.expert_size,
                shared_size=self.shared_size,
                sparse_layers=sorted(self.sparse_layers),
            )
            if self.zero_experts:
                out["zero_experts"] = self.zero_experts
        # the same for the per-layer shapes (MLA, grouped output, layer kinds): present only where the model has them
        for k in _SHAPE_FIELDS:
            if v := getattr(self, k):
                out[k] = dict(v.__dict__) if isinstance(v, MlaSizes) else list(v) if isinstance(v, tuple) else v
        if self.layer_sizes or self.layer_absent:
            out.update(
                layer_sizes={str(i): dict(f) for i, f in self.layer_sizes},
                layer_absent={str(i): list(m) for i, m in self.layer_absent},
            )
        return out

    @property
    def kv_shared_layers(self) -> tuple[int, ...]:
        """The layers that reuse an earlier layer's keys and values (no k_proj of their own: Gemma 4's)."""
        return tuple(layer for layer, absent in self.layer_absent if "k_proj" in absent)

    def at(self, layer: int) -> Geometry:
        """The sizes of decoder layer ``layer``."""
        return replace(self, **dict(dict(self.layer_sizes).get(layer, ())), layer_sizes=(), layer_absent=())


_MOE_FIELDS = ("num_experts", "expert_size", "shared_size", "sparse_layers", "zero_experts")
_SHAPE_FIELDS = ("mla", "layer_kinds", "mlp_kinds", "o_groups", "o_rank")
_LAYER_FIELDS = ("layer_sizes", "layer_absent")


def _mla_sizes(cfg: Mapping[str, Any], need) -> MlaSizes:
    rank = cfg.get("q_lora_rank")
    return MlaSizes(
        None if rank is None else need("q_lora_rank"),
        need("kv_lora_rank"),
        need("qk_nope_head_dim"),
        need("qk_rope_head_dim"),
        need("v_head_dim"),
    )


def _num_layers(layout: Layout, cfg: Mapping[str, Any], need) -> int:
    """num_hidden_layers (× the sub-layers of each, LongCat-Flash's two); Nemotron-H's config has none,
    its per-layer kinds are the layers."""
    key = layout.config.keys.num_hidden_layers
    if key not in cfg and layout.layers.layer_kinds:
        for rule in layout.layers.layer_kinds.rules:
            if rule.form in ("list", "pattern") and isinstance(kinds := _lookup(cfg, rule.keys[0]), (list, str)):
                return len(kinds)
    return need(key) * layout.layers.sub_layers


def _mlp_width(layout: Layout, cfg: Mapping[str, Any], hidden: int, need, key: str | None) -> int:
    """The dense MLP's width: the config's ``key`` (intermediate_size), hidden_size ×
    ``ConfigKeys.mlp_ratio`` where the key is absent or null, or what ``Mlp.ffn_adjust`` derives from it."""
    ratio = layout.config.keys.mlp_ratio
    if key and (cfg.get(key) is not None or ratio is None):
        width = need(key)
    else:
        width = (ratio if isinstance(ratio, int) else need(ratio)) * hidden
    width //= layout.mlp.ffn_divisor
    if layout.mlp.ffn_adjust and cfg.get(layout.mlp.ffn_adjust[0]):
        switch, multiplier, multiple = layout.mlp.ffn_adjust
        width = int(2 * width / 3)
        if cfg.get(multiplier) is not None:
            step = need(multiple)
            width = step * ((int(cfg[multiplier] * width) + step - 1) // step)
    return width


def _shapes_and_kinds(layout: Layout, model_type: str, cfg: Mapping[str, Any], geometry: Geometry, need) -> Geometry:
    """``geometry`` with what the row's MLA, grouped output and layer kinds read from the config."""
    n = geometry.num_layers
    out = geometry
    if layout.attention.mla:  # a head's width in o_proj is v_head_dim (q·k heads are wider)
        mla = _mla_sizes(cfg, need)
        out = replace(out, mla=mla, head_dim=mla.v_head_dim)
    if layout.attention.grouped_output:
        out = replace(out, o_groups=need("o_groups"), o_rank=need("o_lora_rank"))
        if out.num_heads % out.o_groups:
            raise UnsupportedArchitecture(
                f"config.json of this {model_type} model: num_attention_heads = "
                f"{out.num_heads} is not a multiple of o_groups = {out.o_groups}"
            )
    if layout.layers.layer_kinds:
        out = replace(out, layer_kinds=read_kinds(layout.layers.layer_kinds, cfg, n, model_type))
    if layout.layers.mlp_kinds:
        out = replace(out, mlp_kinds=read_kinds(layout.layers.mlp_kinds, cfg, n, model_type))
    if layout.layers.mixer:
        out = replace(out, mixer_width=_mixer_width(layout.layers.mixer, cfg))
    return out


def _mixer_width(mixer: Mixer, cfg: Mapping[str, Any]) -> int:
    """The input width of ``mixer``'s output projection: the product of its first spelling's keys
    (truncated as transformers' ``int(mamba_expand * hidden_size)``), the next spelling where a key of it
    is null (the config class falls back to it); 0 where a key is absent (the class's own default, which
    the table does not guess) or not a positive number."""
    for keys in mixer.width:
        values = [_lookup(cfg, k) for k in keys]
        if any(v is _MISSING for v in values):
            return 0
        if None in values:
            continue
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
            return int(math.prod(values))
        return 0
    return 0


def _geometry(model_type: str, cfg: Mapping[str, Any]) -> Geometry:
    keys = ARCHITECTURES[model_type].config.keys

    def need(key: str) -> int:
        if not isinstance(cfg.get(key), int):
            raise UnsupportedArchitecture(
                f"config.json of this {model_type} model has no integer '{key}'; is it a complete transformers config?"
            )
        return int(cfg[key])

    layout = ARCHITECTURES[model_type]
    heads = need(keys.num_attention_heads)
    hidden = need(keys.hidden_size)
    layers = _num_layers(layout, cfg, need)
    if widths := _layer_widths(layout, cfg, model_type, layers):  # the top level: layer 0's; the others in _per_layer
        cfg = {**cfg, keys.intermediate_size: widths[0]}
    # head_dim is explicit in Gemma/Qwen3 configs and differs from hidden/heads there.
    head_dim = (cfg.get(keys.head_dim) if keys.head_dim else None) or hidden // heads
    ex = layout.experts
    if ex and ex.keys.aliases:  # an alias (the config class's attribute_map) stands for the key where it is absent
        cfg = {**{key: cfg[alias] for alias, key in ex.keys.aliases if alias in cfg}, **cfg}
    size_keys = ex.keys.dense_size_keys if ex else (keys.intermediate_size,)
    dense_key = next((k for k in size_keys if k and cfg.get(k) is not None), size_keys[0]) if size_keys else None
    has_dense = (dense_key or keys.mlp_ratio) and (layout.layers.mlp_kinds is None or layout.layers.mlp_kinds.editable)
    dense = _shapes_and_kinds(
        layout,
        model_type,
        cfg,
        Geometry(
            layers,
            heads,
            _kv_heads(keys, cfg, heads, need),
            int(head_dim),
            hidden,
            _mlp_width(layout, cfg, hidden, need, dense_key) if has_dense else 0,
            vocab_size=int(cfg.get("vocab_size") or 0),
        ),
        need,
    )
    if ex is None:
        return dense
    num = next((k for k in ex.keys.num_keys if cfg.get(k) is not None), ex.keys.num_keys[0])
    shared = need(ex.shared.size_key) if ex.shared else 0
    if ex.shared and ex.shared.count_key:
        shared *= need(ex.shared.count_key)
    sparse = _sparse_layers(model_type, ex.layers, cfg, layers) if need(num) > 0 else frozenset()
    if sparse and len(sparse) < layers and not dense_key:
        raise UnsupportedArchitecture(
            f"config.json of this {model_type} model makes layers "
            f"{sorted(set(range(layers)) - sparse)} dense, but {model_type} has no dense "
            "MLP layers; is it a complete transformers config?"
        )
    return replace(
        dense,
        num_experts=need(num),
        expert_size=need(ex.keys.size_key),
        shared_size=shared,
        sparse_layers=sparse,
        zero_experts=int(cfg.get(ex.keys.zero_key) or 0) if ex.keys.zero_key else 0,
    )


def _sparse_layers(model_type: str, sparse: SparseLayers, cfg: Mapping[str, Any], layers: int) -> frozenset[int]:
    """The layers whose MLP is a mixture of experts, by the config's keys (see ``SparseLayers``)."""
    kinds = cfg.get(sparse.layer_types_key) if sparse.layer_types_key else None
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) != layers:
            raise UnsupportedArchitecture(
                f"config.json of this {model_type} model has '{sparse.layer_types_key}' = {kinds!r:.60}, not a list of "
                f"num_hidden_layers = {layers} layer kinds; correct it or drop it"
            )
        return frozenset(i for i, kind in enumerate(kinds) if kind == "sparse")
    listed = cfg.get(sparse.sparse_list_key) if sparse.sparse_list_key else None
    if listed is not None:
        if not isinstance(listed, list) or not all(isinstance(i, int) and 0 <= i < layers for i in listed):
            raise UnsupportedArchitecture(
                f"config.json of this {model_type} model has '{sparse.sparse_list_key}' = {listed!r:.60}, not a list of "
                f"layer indices in 0..{layers - 1}; correct it or drop it"
            )
        return frozenset(listed)
    rule = sparse.rule
    step = int(cfg.get(rule.step_key) or 1) if rule.step_key else rule.step
    only_dense = set(cfg.get(rule.dense_layers_key) or []) if rule.dense_layers_key else set()
    first = rule.first_dense_default
    if rule.first_dense_key and cfg.get(rule.first_dense_key) is not None:
        first = int(cfg[rule.first_dense_key])
    last = int(cfg.get(rule.last_sparse_key, -1)) if rule.last_sparse_key else -1
    last = layers - 1 if last == -1 else last
    # transformers' rule (Qwen-MoE): experts where layer ∉ mlp_only_layers and (layer+1) % step == 0.
    offset = int(cfg.get(rule.offset_key) or 0) if rule.offset_key else rule.offset
    return frozenset(
        i for i in range(layers) if first <= i <= last and i not in only_dense and i % step == offset % step
    )


def _layer_widths(layout: Layout, cfg: Mapping[str, Any], model_type: str, n: int) -> list[int] | None:
    """Each layer's MLP width where the row lets config.json list one per layer and it does (Gemma 3n's
    intermediate_size); None where the key holds one width for every layer."""
    key = layout.config.keys.intermediate_size
    widths = cfg.get(key) if key and layout.layers.layer_sizes and layout.layers.layer_sizes.widths_per_layer else None
    if not isinstance(widths, list):
        return None
    if len(widths) != n or not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths):
        raise UnsupportedArchitecture(
            f"config.json of this {model_type} model has '{key}' = {widths!r:.60}, not one positive integer "
            f"width per layer (num_hidden_layers = {n}); correct it"
        )
    return widths


def _kv_heads(keys: ConfigKeys, cfg: Mapping[str, Any], heads: int, need: Callable[[str], int]) -> int:
    """The number of k/v heads: set by a flag of ``kv_heads_when``, else its key, else one per head."""
    for flag, source in keys.kv_heads_when:
        if cfg.get(flag):
            return source if isinstance(source, int) else need(source)
    return int((cfg.get(keys.num_key_value_heads) if keys.num_key_value_heads else None) or heads)


# transformers' per_layer_config keys → the Geometry fields they set for one layer.
_PER_LAYER_FIELDS = {
    "head_dim": "head_dim",
    "num_key_value_heads": "num_kv_heads",
    "num_attention_heads": "num_heads",
    "intermediate_size": "intermediate_size",
}


def _per_layer(layout: Layout, model_type: str, cfg: Mapping[str, Any], g: Geometry) -> Geometry:
    """``g`` with the layers that differ: transformers' ``per_layer_config`` (layer → the sizes it
    overrides) and the row's :class:`LayerSizes` rules."""
    sizes = {
        int(layer): {field: int(over[key]) for key, field in _PER_LAYER_FIELDS.items() if key in over}
        for layer, over in (cfg.get("per_layer_config") or {}).items()
    }
    absent: dict[int, tuple[str, ...]] = {}
    rules, n = layout.layers.layer_sizes, g.num_layers
    for layer, width in enumerate(_layer_widths(layout, cfg, model_type, n) or ()):
        if width != g.intermediate_size:
            sizes.setdefault(layer, {})["intermediate_size"] = width
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
    return replace(
        g,
        layer_sizes=tuple((i, tuple(sorted(f.items()))) for i, f in sorted(sizes.items()) if f),
        layer_absent=tuple(sorted(absent.items())),
    )
