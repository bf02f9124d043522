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
}

TABLE_LOCATION = "surgery/core/architectures.py (the ARCHITECTURES table)"


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
    # The vocabulary (rows of the embedding table); not part of to_dict (findings predate it).
    vocab_size: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; a dense model's dict has only the dense fields (findings written before MoE
        support record exactly those, and must still match)."""
        out = {k: v for k, v in self.__dict__.items() if k not in _MOE_FIELDS and k != "vocab_size"}
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
    dense = Geometry(layers, heads, int(cfg.get("num_key_value_heads") or heads), int(head_dim), hidden,
                     need("intermediate_size"), vocab_size=int(cfg.get("vocab_size") or 0))
    ex = ARCHITECTURES[model_type].experts
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
    if layout is None:
        raise UnsupportedArchitecture(
            f"model_type '{model_type}' is not supported (supported: "
            f"{', '.join(sorted(ARCHITECTURES))}); to add it, extend {TABLE_LOCATION}"
        )
    return Architecture(str(model_type), layout, _geometry(str(model_type), text_config(config)))
