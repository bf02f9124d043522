"""An architecture: a table row with the sizes of one config, answering names and shapes."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..errors import UnsupportedArchitecture
from .expert_tensors import ExpertTensors
from .geometry import Geometry, _geometry, _per_layer
from .kinds import ATTENTION_KINDS
from .layout import TABLE_LOCATION, Layout
from .refusals import KIND_REFUSALS
from .table import ARCHITECTURES, refusal, text_config


@dataclass(frozen=True)
class Architecture(ExpertTensors):
    """A supported model: its layout and its geometry (where its experts' matrices lie:
    :class:`~.expert_tensors.ExpertTensors`)."""

    model_type: str
    layout: Layout
    geometry: Geometry

    def loaded_names(self, names: Iterable[str]) -> dict[str, str]:
        """Each stored name of ``names`` under the name the loaded model gives it (``renames``)."""
        out = {}
        for name in names:
            loaded = name
            for pattern, replacement in self.layout.names.renames:
                loaded = re.sub(pattern, replacement, loaded, count=1)
            out[loaded] = name
        return out

    def layer_prefix(self, names: Iterable[str]) -> str:
        """The layer-prefix template that ``names`` (tensor or module names) use.

        Exactly one spelling of the table must occur; anything else is a clear error.
        """
        names = list(names)
        found = [p for p in self.layout.names.layer_prefixes if any(n.startswith(p.format(layer=0)) for n in names)]
        if len(found) != 1:
            raise UnsupportedArchitecture(
                f"{self.model_type}: expected decoder layers under one of "
                f"{', '.join(p.format(layer='N') for p in self.layout.names.layer_prefixes)}, "
                f"found {'none' if not found else 'several'}; extend {TABLE_LOCATION}"
            )
        return found[0]

    def block(self, layer: int, module: str) -> tuple[int, str]:
        """Where ``module`` (relative to a layer) of the table's layer ``layer`` lies: (the decoder layer,
        the module's name in it). Itself, except where a decoder layer holds several sub-layers
        (``Layers.sub_layers``, LongCat-Flash): layer 5, "self_attn.{sub}.o_proj" → (2, "self_attn.1.o_proj")."""
        n = self.layout.layers.sub_layers
        return layer // n, module.replace("{sub}", str(layer % n))

    def module_name(self, prefix: str, layer: int, module: str) -> str:
        """The full name of layer ``layer``'s ``module`` under the layer-prefix template ``prefix``."""
        decoder, name = self.block(layer, module)
        return f"{prefix.format(layer=decoder)}{name}"

    def root_prefix(self, names: Iterable[str]) -> str:
        """The prefix of what sits next to the layer list (embeddings, final norm): ``model.`` for
        ``model.layers.{layer}.``, ``transformer.`` for ``transformer.h.{layer}.``, ``""`` at the top."""
        prefix = self.layer_prefix(names)
        root = prefix[: prefix.index("{layer}")].rstrip(".").rpartition(".")[0]
        return f"{root}." if root else ""

    def loaded_name(self, native: str) -> tuple[str, bool] | None:
        """The transformers name of a tensor stored under a native name (see ``NativeName``), and
        whether its rows are permuted; None when the table knows no such name."""
        for entry in self.layout.names.native_names:
            if match := re.fullmatch(entry.pattern, native):
                return match.expand(entry.loaded), entry.permuted
        return None

    def is_sparse(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is a mixture of experts."""
        return layer in self.geometry.sparse_layers

    def mlp_input_modules(self) -> tuple[str, ...]:
        """Names (relative to a layer) of the matrices whose rows feed the MLP neurons."""
        mlp = self.layout.mlp
        if mlp.gate_up_proj:
            return (mlp.gate_up_proj,)
        return tuple(m for m in (mlp.gate_proj, mlp.up_proj) if m)

    def neuron_rows(self, module: str, neuron: int) -> tuple[int, ...]:
        """Rows of ``module`` (an MLP input matrix) that belong to ``neuron``."""
        if module == self.layout.mlp.gate_up_proj:
            return (neuron, self.geometry.intermediate_size + neuron)
        return (neuron,)

    def mlp_shapes(self) -> dict[str, tuple[int, int]]:
        """Expected weight shape of each MLP matrix (relative to a layer): down_proj (H, I), the
        gate/up inputs (I, H), a fused gate_up (2I, H)."""
        g, mlp = self.geometry, self.layout.mlp
        shapes = {mlp.down_proj: (g.hidden_size, g.intermediate_size)}
        for module in self.mlp_input_modules():
            width = 2 * g.intermediate_size if module == mlp.gate_up_proj else g.intermediate_size
            shapes[module] = (width, g.hidden_size)
        return shapes

    def attention_shapes(self) -> dict[str, tuple[tuple[int, int], str]]:
        """Expected weight shape of each attention matrix (relative to a layer), with the config
        fields that set its head dimension, as ``name → ((rows, cols), "fields = sizes")``."""
        g, att, keys = self.geometry, self.layout.attention, self.layout.config.keys
        if self.layout.limits.head_refusal:  # no head edits: the table knows no head layout to check the shapes by
            return {}
        if att.mla or att.grouped_output:
            return mla_shapes(self) if att.mla else grouped_output_shapes(self)
        q_rows, kv_rows = g.num_heads * g.head_dim, g.num_kv_heads * g.head_dim
        # the family's own config keys, so that the message names the fields to correct
        heads, dim = keys.num_attention_heads, keys.head_dim or f"({keys.hidden_size} / {keys.num_attention_heads})"
        kv_heads = keys.num_key_value_heads or (
            f"k/v heads (set by {', '.join(flag for flag, _ in keys.kv_heads_when)})" if keys.kv_heads_when else heads
        )
        q = f"{heads} × {dim} = {g.num_heads} × {g.head_dim}"
        kv = f"{kv_heads} × {dim} = {g.num_kv_heads} × {g.head_dim}"

        def side(module: str, out: bool) -> str:  # the stored side of the [out, in] map's out/in features
            return "rows" if out != self.stored_flipped(module) else "columns"

        shapes = {att.o_proj: ((g.hidden_size, q_rows), f"{q} {side(att.o_proj, False)}")}
        if att.q_proj:  # a gated attention's q_proj holds each head's query and gate: twice the rows
            gate = 2 if att.q_gate else 1
            shapes[att.q_proj] = (
                (gate * q_rows, g.hidden_size),
                f"{'2 × ' if att.q_gate else ''}{q} {side(att.q_proj, True)}",
            )
        for name in (att.k_proj, att.v_proj):
            if name:
                shapes[name] = ((kv_rows, g.hidden_size), f"{kv} {side(name, True)}")
        if att.qkv_proj:
            shapes[att.qkv_proj] = (
                (q_rows + 2 * kv_rows, g.hidden_size),
                f"({heads} + 2 × {kv_heads}) × {dim} = ({g.num_heads} + 2 × {g.num_kv_heads}) "
                f"× {g.head_dim} {side(att.qkv_proj, True)}",
            )
        return shapes

    def attention_output(self) -> tuple[str, tuple[int, int]]:
        """The module that writes the attention's output into the residual stream (relative to a
        layer) and its weight's expected shape: o_proj, or DeepSeek-V4's o_b_proj, which mixes the
        groups of its grouped o_a_proj (``Attention.o_proj`` there)."""
        att = self.layout.attention
        module = att.grouped_output.o_b_proj if att.grouped_output else att.o_proj
        return module, self.attention_shapes()[module][0]

    def head_columns(self, head: int) -> slice:
        """Columns of o_proj (its input features) that carry ``head``'s output (DeepSeek-V4: within
        its group, see :meth:`head_group`)."""
        d = self.geometry.head_dim
        if self.layout.attention.grouped_output:
            head %= self.geometry.num_heads // self.geometry.o_groups
        return slice(head * d, (head + 1) * d)

    # --- hybrid layers, MLA, stored names ------------------------------------------------------------

    def head_group(self, head: int) -> tuple[int, int] | None:
        """(group, groups) of ``head`` where o_proj is a grouped linear (DeepSeek-V4's o_a_proj: the
        heads' outputs split into groups, each projected by its own block of rows); else None."""
        g = self.geometry
        if not self.layout.attention.grouped_output:
            return None
        return head // (g.num_heads // g.o_groups), g.o_groups

    def stored_module(self, module: str) -> str:
        """``module`` (an in-memory name relative to a layer) as the family's releases store it
        (``Names.stored_names``; itself where they keep transformers' name)."""
        for loaded, stored in self.layout.names.stored_names:
            if f"{module}.".startswith(loaded):
                return (stored + f"{module}."[len(loaded) :])[:-1]
        return module

    def stored_flipped(self, module: str) -> bool:
        """Whether ``module``'s weight is stored [in, out] (a Conv1D) instead of [out, in]."""
        return module in self.layout.names.conv1d

    def stored_shape(self, module: str, shape: tuple[int, int]) -> tuple[int, int]:
        """The stored shape of ``module``'s weight, whose [out, in] shape is ``shape``."""
        return (shape[1], shape[0]) if self.stored_flipped(module) else shape

    def layer_kind(self, layer: int) -> str | None:
        """The kind of ``layer`` in a hybrid model ("full_attention", "linear_attention", …); None: not hybrid."""
        kinds = self.geometry.layer_kinds
        return kinds[layer] if kinds else None

    def head_layers(self) -> tuple[int, ...]:
        """The layers with attention heads at o_proj (all but a hybrid model's other kinds)."""
        lk, n = self.layout.layers.layer_kinds, self.geometry.num_layers
        if self.layout.limits.head_refusal:
            return ()
        if lk is None:
            return tuple(range(n))
        return tuple(i for i, kind in enumerate(self.geometry.layer_kinds) if kind in lk.editable)

    def dense_mlp_layers(self) -> tuple[int, ...]:
        """The layers with a dense MLP (not a mixture of experts, unless its layers keep their dense MLP
        too, ``SparseLayers.with_dense``; not a layer without MLP)."""
        mk, g, ex = self.layout.layers.mlp_kinds, self.geometry, self.layout.experts
        beside = ex is not None and ex.layers.with_dense
        return tuple(
            i
            for i in range(g.num_layers)
            if (beside or not self.is_sparse(i)) and (mk is None or g.mlp_kinds[i] in mk.editable)
        )

    def check_findable(self, finder: str, instead: str) -> None:
        """One line when ``finder`` cannot run on this family (``Limits.find_refusal``), saying to do ``instead``."""
        if self.layout.limits.find_refusal:
            raise UnsupportedArchitecture(
                f"{self.model_type}: {finder} cannot run on it: {self.layout.limits.find_refusal}; {instead}"
            )

    def kv_cache_only(self) -> bool:
        """Whether the model caches one key/value pair per layer and nothing else (no state-space,
        convolution or compressed state): a shared prefix or a resumed pass may slice its cache."""
        return self.layout.limits.kv_cache and all(k in ATTENTION_KINDS for k in self.geometry.layer_kinds)

    def at(self, layer: int) -> Architecture:
        """The architecture as decoder layer ``layer`` has it: that layer's sizes, and no attention
        inputs it lacks (a row whose layers are all alike is itself)."""
        g = self.geometry
        if not (g.layer_sizes or g.layer_absent):
            return self
        absent = dict(g.layer_absent).get(layer, ())
        attention = replace(self.layout.attention, **dict.fromkeys(absent))  # the attention inputs it lacks
        return Architecture(self.model_type, replace(self.layout, attention=attention), g.at(layer))

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
        if self.layout.limits.head_refusal:
            why.append(f"heads ({self.layout.limits.head_refusal})")
        elif g.layer_kinds and layer not in self.head_layers():
            why.append(KIND_REFUSALS.get(("heads", g.layer_kinds[layer])))
        why.append(self._mlp_refusal(layer))
        return tuple(dict.fromkeys(w for w in why if w))

    def _mlp_refusal(self, layer: int) -> str | None:
        """What ``layer`` holds in place of a dense MLP or the row's experts that surgery does not edit, and why."""
        g = self.geometry
        if g.mlp_kinds and layer not in self.dense_mlp_layers() and not self.is_sparse(layer):
            return KIND_REFUSALS.get(("mlp", g.mlp_kinds[layer]))
        return None

    # --- residual writers ----------------------------------------------------------------------------

    def mixer_layers(self) -> tuple[int, ...]:
        """The layers with the row's other token mixer (``Layers.mixer``: Mamba, linear attention, a short
        convolution), whose output projection writes into the residual stream."""
        mixer, g = self.layout.layers.mixer, self.geometry
        if mixer is None:
            return ()
        if mixer.kinds is None:  # beside the attention of every layer (Falcon-H1)
            return tuple(range(g.num_layers))
        return tuple(i for i, kind in enumerate(g.layer_kinds) if kind in mixer.kinds)

    def mixer_output(self) -> tuple[str, tuple[int, int]]:
        """The mixer's output projection (relative to a layer) and its weight's expected shape [hidden, width]."""
        return self.layout.layers.mixer.module, (self.geometry.hidden_size, self.geometry.mixer_width)

    def residual_writers(self, layer: int) -> dict[str, str]:
        """The modules through which ``layer`` writes into the residual stream that a direction edit projects
        exactly, by recipe role (``attention``, ``mixer``, ``mlp``, ``experts``, ``shared_experts``; see
        surgery/core/direction_edit.py) → module name relative to the layer (the experts' fused down matrix)."""
        lay, out = self.layout, {}
        if layer in self.head_layers():
            out["attention"] = self.attention_output()[0]
        if self.geometry.mixer_width and layer in self.mixer_layers():
            out["mixer"] = lay.layers.mixer.module
        if layer in self.dense_mlp_layers():
            out["mlp"] = lay.mlp.down_proj
        if self.is_sparse(layer):
            out["experts"] = f"{lay.experts.weights.module}.down_proj"
            if lay.experts.shared:
                out["shared_experts"] = f"{lay.experts.shared.module}.{lay.experts.shared.down}"
        return {role: self.block(layer, module)[1] for role, module in out.items()}

    def unprojected_writers(self, layer: int) -> tuple[tuple[str, str], ...]:
        """The residual writers of ``layer`` the table knows but cannot project a direction through
        exactly, each as (the side it writes for, "attention" or "mlp"; what it is and why)."""
        lay, out = self.layout, []
        if lay.limits.head_refusal:
            out.append(
                (
                    "attention",
                    f"the attention output {lay.attention.o_proj} (the table has no head layout to size it by)",
                )
            )
        if lay.layers.mixer and layer in self.mixer_layers() and not self.geometry.mixer_width:
            spelled = ", else ".join(" × ".join(keys) for keys in lay.layers.mixer.width)
            out.append(("attention", f"{lay.layers.mixer.module} (config.json does not give its width: {spelled})"))
        if why := self._mlp_refusal(layer):
            out.append(("mlp", why))
        return tuple(out)

    def layer_edits(self, layer: int) -> LayerEdits:
        """What decoder layer ``layer`` lets an edit touch, at its own sizes, and what it holds that
        surgery refuses (read from the config: no weights)."""
        g = self.at(layer).geometry
        heads = g.num_heads if layer in self.head_layers() else 0
        neurons = g.intermediate_size if layer in self.dense_mlp_layers() else 0
        experts = (g.num_experts, g.expert_size, g.shared_size) if self.is_sparse(layer) else (0, 0, 0)
        refused = self.refused_parts(layer)
        return LayerEdits(
            heads,
            neurons,
            *experts,
            refused=refused,
            kind=self.kind_name(layer),
            writers=tuple(self.residual_writers(layer).values()),
            unprojected=tuple(why for _, why in self.unprojected_writers(layer) if why not in refused),
        )

    def layer_kinds(self) -> list[tuple[tuple[int, ...], LayerEdits]]:
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
    surgery does not edit, each with its reason; ``kind``: a hybrid model's kind of layer; ``writers``: the
    modules through which the layer writes into the residual stream that a direction edit projects, and
    ``unprojected``: those it cannot project (each with its reason), not already among ``refused``."""

    heads: int
    neurons: int
    experts: int = 0
    expert_width: int = 0
    shared_width: int = 0
    refused: tuple[str, ...] = ()
    kind: str = ""
    writers: tuple[str, ...] = ()
    unprojected: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: only what the layer has (and what it refuses)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items() if v}

    def text(self) -> str:
        """One line, e.g. "4 heads; 4 experts × 16 neurons; shared expert: 24 neurons; residual writers:
        self_attn.o_proj, mlp.experts.down_proj, mlp.shared_expert.down_proj", or "nothing; refused: …"
        for a layer no head or neuron edit can touch."""
        parts = [f"{self.heads} heads"] if self.heads else []
        if self.neurons:
            parts.append(f"{self.neurons} MLP neurons")
        if self.experts:
            parts.append(f"{self.experts} experts × {self.expert_width} neurons")
        if self.shared_width:
            parts.append(f"shared expert: {self.shared_width} neurons")
        refused = [f"refused: {why}" for why in self.refused]
        writers = [f"residual writers: {', '.join(self.writers) or 'none'}"]
        return "; ".join((parts or ["nothing"]) + refused + writers + [f"not projected: {w}" for w in self.unprojected])


# --- MLA and DeepSeek-V4's grouped output: their shapes from the config ---


def mla_shapes(arch: Architecture) -> dict[str, tuple[tuple[int, int], str]]:
    """Expected shapes of an MLA layer's matrices (see :class:`Mla`), as ``Architecture.attention_shapes``."""
    g, mla, m = arch.geometry, arch.layout.attention.mla, arch.geometry.mla
    heads, H, qk = g.num_heads, g.hidden_size, m.qk_nope_head_dim + m.qk_rope_head_dim
    q = f"num_attention_heads × (qk_nope_head_dim + qk_rope_head_dim) = {heads} × {qk} rows"
    shapes = {
        arch.layout.attention.o_proj: (
            (H, heads * m.v_head_dim),
            f"num_attention_heads × v_head_dim = {heads} × {m.v_head_dim} columns",
        ),
        mla.kv_a_proj: (
            (m.kv_lora_rank + m.qk_rope_head_dim, H),
            f"kv_lora_rank + qk_rope_head_dim = {m.kv_lora_rank} + {m.qk_rope_head_dim} rows",
        ),
        mla.kv_b_proj: (
            (heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
            f"num_attention_heads × (qk_nope_head_dim + v_head_dim) = {heads} × "
            f"{m.qk_nope_head_dim + m.v_head_dim} rows, kv_lora_rank = {m.kv_lora_rank} columns",
        ),
    }
    if m.q_lora_rank is None and mla.q_proj:
        shapes[mla.q_proj] = ((heads * qk, H), q)
    if m.q_lora_rank is not None and mla.q_a_proj:
        shapes[mla.q_a_proj] = ((m.q_lora_rank, H), f"q_lora_rank = {m.q_lora_rank} rows")
    if m.q_lora_rank is not None and mla.q_b_proj:
        shapes[mla.q_b_proj] = ((heads * qk, m.q_lora_rank), f"{q}, q_lora_rank = {m.q_lora_rank} columns")
    return shapes


def grouped_output_shapes(arch: Architecture) -> dict[str, tuple[tuple[int, int], str]]:
    """Expected shapes of DeepSeek-V4's attention matrices (see :class:`GroupedOutput`)."""
    g, go = arch.geometry, arch.layout.attention.grouped_output
    heads, d, G, R, H = g.num_heads, g.head_dim, g.o_groups, g.o_rank, g.hidden_size
    return {
        arch.layout.attention.o_proj: (
            (G * R, heads * d // G),
            f"o_groups × o_lora_rank = {G} × {R} rows, num_attention_heads × head_dim / "
            f"o_groups = {heads} × {d} / {G} columns",
        ),
        go.o_b_proj: ((H, G * R), f"o_groups × o_lora_rank = {G} × {R} columns"),
        go.kv_proj: ((d, H), f"head_dim = {d} rows (one key/value head)"),
    }


def architecture(config: Mapping[str, Any]) -> Architecture:
    """Look up a config dict (config.json) in the table; a refused family is one line saying why."""
    why = refusal(config)
    if why:
        raise UnsupportedArchitecture(why)
    model_type = str(config.get("model_type"))
    layout, cfg = ARCHITECTURES[model_type], text_config(config)
    return Architecture(model_type, layout, _per_layer(layout, model_type, cfg, _geometry(model_type, cfg)))
