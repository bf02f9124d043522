"""The one place that knows where heads and neurons live in each architecture.

Everything else asks this table for tensor and module names. Supporting a new model_type means
adding a row to ``ARCHITECTURES`` below, never a try/except elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .errors import UnsupportedArchitecture


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
    # After the decoder layers (a knockout pass resumed at layer L runs the model's tail itself):
    # the final norm, a sibling of the layer list, and the config field of a logit soft-cap.
    final_norm: str = "norm"
    logit_softcap: str | None = None


_DECODER = ("model.layers.{layer}.",)

ARCHITECTURES: dict[str, Layout] = {
    "llama": Layout(_DECODER),
    "mistral": Layout(_DECODER),
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
    # head_dim is explicit in Gemma/Qwen3 configs and differs from hidden/heads there.
    head_dim = cfg.get("head_dim") or hidden // heads
    return Geometry(
        num_layers=need("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        hidden_size=hidden,
        intermediate_size=need("intermediate_size"),
    )


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
