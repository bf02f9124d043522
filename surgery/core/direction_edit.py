"""The ``direction`` edit kind: remove (or scale) a direction r from what one module writes into the
residual stream, W ← W − weight·r(rᵀW), baked exactly.

``module`` names the residual writer by role, not by tensor name: ``attention`` (the attention
output matrix), ``mixer`` (the output projection of a hybrid layer's other token mixer: a Mamba
block, linear attention, a short convolution; ``Layers.mixer``), ``mlp`` (the dense MLP's down
matrix), ``experts`` (every routed expert's down matrix of a mixture-of-experts layer),
``shared_experts`` (the shared expert's down matrix) or ``embeddings`` (the token embedding table;
``layer`` is not used). ``Architecture.residual_writers`` says which roles a layer has. ``vector`` is
``FILE.safetensors#NAME`` (surgery/core/vectors.py); ``weight`` 1 removes the direction, 0 < w < 1
weakens it, w < 0 strengthens it. A module's bias, where it has one, is projected too: the twin
projects the module's whole output.

The ``steer`` kind (:class:`SteerEdit`) is its additive form: b ← b + weight·r on the module's
output bias (a control vector), where the checkpoint has that bias.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .edit_kind import Edit, check_layer, check_scale, index, layer_list, number, recipe_key, register_edit_kind
from .errors import RecipeError
from .head_edit import check_head_layer
from .neuron_edit import check_dense_mlp
from .sites import Site
from .vectors import VectorSource, sha256_hex, vector_spec

if TYPE_CHECKING:
    from .architectures import Architecture

MODULES = ("attention", "mixer", "mlp", "experts", "shared_experts", "embeddings")


def module_role(value: Any, where: str) -> str:
    """A residual writer by role (see :data:`MODULES`)."""
    if value not in MODULES:
        raise RecipeError(f"{where} must be one of {', '.join(MODULES)}, got {value!r}")
    return value


def check_mixer_layer(arch: Architecture, layer: int, where: str) -> None:
    """``layer`` writes through the row's other token mixer (``Layers.mixer``), whose width the config gives."""
    mixer = arch.layout.layers.mixer
    if mixer is None:
        raise RecipeError(
            f"{where}.module = mixer but {arch.model_type} has no token mixer other than attention; use attention"
        )
    if layer not in arch.mixer_layers():
        raise RecipeError(
            f"{where}.module = mixer but layer {layer} of this {arch.model_type} model is a "
            f"{arch.layer_kind(layer)} layer without {mixer.module} (it is in layers "
            f"{layer_list(arch.mixer_layers())}); use attention"
        )
    if not arch.geometry.mixer_width:
        spelled = ", else ".join(" × ".join(keys) for keys in mixer.width)
        raise RecipeError(
            f"{where}.module = mixer but config.json does not give the width of {mixer.module} ({spelled}); add it"
        )


@register_edit_kind
@dataclass(frozen=True)
class DirectionEdit(Edit):
    """W ← W − weight·r(rᵀW) on the residual writer ``module`` of ``layer``, r = ``vector`` / ‖vector‖.

    Build it from a recipe entry: ``Recipe.load`` reads the vector file relative to the recipe.
    """

    kind: ClassVar[str] = "direction"
    scale_key: ClassVar[str] = "weight"
    keys: ClassVar[tuple[str, ...]] = ("layer", "module", "vector", "weight", "sha256")

    module: str = recipe_key(module_role)
    vector: str = recipe_key(vector_spec)
    weight: float = recipe_key(number)
    layer: int | None = recipe_key(index, default=None)
    sha256: str | None = recipe_key(sha256_hex, default=None)
    # The float32 unit vector's bytes, read once from ``vector`` (not a recipe key: the file is).
    unit: bytes = field(default=b"", compare=False, repr=False)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str, vectors: VectorSource | None = None) -> DirectionEdit:
        """Parse the entry, then read its vector from ``vectors`` (None: not read; sites then carry
        no direction and a bake refuses the recipe, but its card rows can still be written)."""
        edit = super().from_dict(raw, where)
        if vectors is None:
            return edit
        unit, digest = vectors.unit(edit.vector, edit.sha256, where)
        return dataclasses.replace(edit, sha256=digest, unit=unit.tobytes())

    @property
    def target(self) -> tuple[str, int | None, str]:
        return ("direction", None if self.module == "embeddings" else self.layer, self.module)

    @property
    def label(self) -> str:
        return self.module if self.module == "embeddings" else f"{self.layer}:{self.module}"

    @property
    def setting(self) -> str:
        return f"{self.vector} × {self.weight}"

    def is_identity(self) -> bool:
        return self.weight == 0.0

    def validate(self, arch: Architecture, where: str) -> None:
        """The module exists in this layer, and the vector has the hidden size."""
        check_scale(self.weight, where)
        if not self.unit:
            raise RecipeError(
                f"{where}.vector: '{self.vector}' was not read; load the recipe from its file "
                "(Recipe.load) so that the path is read relative to it"
            )
        H = arch.geometry.hidden_size
        if len(self.unit) // 4 != H:
            raise RecipeError(
                f"{where}.vector: '{self.vector}' has {len(self.unit) // 4} values but the model has "
                f"hidden_size = {H}; give a direction of the model's residual stream"
            )
        if self.module == "embeddings":
            if arch.layout.names.embeddings is None:
                raise RecipeError(
                    f"{where}.module = embeddings but {arch.model_type}'s embedding table is not next to "
                    "its layer list, where the table looks for it; edit a decoder layer's modules"
                )
            return
        if self.layer is None:
            raise RecipeError(f"{where}: missing key layer (module {self.module} is in a decoder layer)")
        check_layer(arch, self.layer, where)
        ex, sparse = arch.layout.experts, arch.is_sparse(self.layer)
        if self.module == "attention" and arch.layout.limits.head_refusal:
            raise RecipeError(
                f"{where}.module = attention but {arch.model_type}'s attention output is not in the table: "
                f"{arch.layout.limits.head_refusal}"
            )
        writers = arch.residual_writers(self.layer)
        if self.module == "attention" and "attention" not in writers and "mixer" in writers:
            raise RecipeError(
                f"{where}.module = attention but layer {self.layer} is a {arch.layer_kind(self.layer)} layer: "
                f"it writes through {writers['mixer']}; use mixer"
            )
        if self.module == "attention":  # a hybrid model's other layer kinds write through other modules
            check_head_layer(arch, self.layer, where, what="attention output (o_proj) to project")
        if self.module == "mixer":
            check_mixer_layer(arch, self.layer, where)
        if self.module == "mlp" and sparse and self.layer not in arch.dense_mlp_layers():
            shared = ", shared_experts" if ex.shared else ""
            raise RecipeError(
                f"{where}.module = mlp but layer {self.layer} is a mixture of experts; use experts{shared}"
            )
        if self.module == "mlp":  # state-space or attention-only layers, experts the table has no row for
            check_dense_mlp(arch, self.layer, where)
        if self.module in ("experts", "shared_experts") and not sparse:
            raise RecipeError(
                f"{where}.module = {self.module} but layer {self.layer} of {arch.model_type} is a "
                "dense MLP (no experts); use mlp"
            )
        if self.module == "shared_experts" and not ex.shared:
            raise RecipeError(
                f"{where}.module = shared_experts but {arch.model_type} has no shared expert; use experts"
            )

    def sites(self, arch: Architecture) -> list[Site]:
        """One projection per matrix: the module's output matrix, or each routed expert's down matrix."""
        g, lay = arch.geometry, arch.layout
        r, w, L = self.unit or None, self.weight, self.layer

        def site(
            module: str, shape: tuple[int, int], axis: str = "out", layer: int | None = L, expert: int | None = None
        ) -> Site:
            return Site(layer, module, axis, (), w, shape, True, expert, op="project", direction=r)

        if self.module == "attention":
            return [site(*arch.attention_output())]
        if self.module == "mixer":
            return [site(*arch.mixer_output())]
        if self.module == "mlp":
            return [site(lay.mlp.down_proj, arch.mlp_shapes()[lay.mlp.down_proj])]
        if self.module == "experts":
            return [
                site(f"{lay.experts.weights.module}.down", (g.hidden_size, g.expert_size), expert=e)
                for e in range(g.num_experts)
            ]
        if self.module == "shared_experts":
            ex = lay.experts
            return [site(f"{ex.shared.module}.{ex.shared.down}", (g.hidden_size, g.shared_size))]
        # The embedding table is stored [vocab, hidden]: the residual stream is its columns.
        return [site(lay.names.embeddings, (g.vocab_size, g.hidden_size), axis="in", layer=None)]

    def lora_refusal(self, arch: Architecture) -> str | None:
        if self.module == "embeddings":
            return (
                "a direction edit of the embeddings has no exact adapter here (a tied table is also the "
                "output head); ship the baked checkpoint instead"
            )
        if self.module == "mixer":
            return arch.layout.layers.mixer.lora_refusal
        return None

    def card_row(self, where: str) -> tuple[str, str, str, str, str]:
        kept = "removed" if self.weight == 1 else f"× {1 - self.weight:g}"
        return (
            "direction",
            "—" if self.module == "embeddings" else str(self.layer),
            self.module,
            f"w = {self.weight:g}",
            f"direction `{self.vector}` {kept} in what {where} writes",
        )

    def card_tags(self) -> tuple[str, ...]:
        return ("direction-ablation",) if self.weight > 0 else ("direction-steering",)


@register_edit_kind
@dataclass(frozen=True)
class SteerEdit(DirectionEdit):
    """b ← b + weight·r on the output bias of the residual writer ``module`` of ``layer``: a control
    vector, added to what the module writes whatever its input (r = ``vector`` / ‖vector‖).

    The same keys as ``direction``; its target is the direction edit's, so the two on one module
    conflict (both would change its bias, and their order would matter). A module without a bias in
    the checkpoint is refused when the recipe is planned on it (surgery/core/resolve.py): adding a
    bias tensor would change the checkpoint's names and config.
    """

    kind: ClassVar[str] = "steer"

    @property
    def setting(self) -> str:
        return f"+ {self.weight} × {self.vector}"

    def validate(self, arch: Architecture, where: str) -> None:
        """As a direction edit's, but a decoder layer's writer: the embedding table has no bias."""
        if self.module == "embeddings":
            raise RecipeError(
                f"{where}.module = embeddings but a steer edit adds to an output bias, which the embedding "
                "table does not have; steer a layer's attention or mlp"
            )
        super().validate(arch, where)

    def sites(self, arch: Architecture) -> list[Site]:
        """One addition per bias: the module's output bias, or each routed expert's down bias."""
        return [dataclasses.replace(s, op="add") for s in super().sites(arch)]

    def lora_refusal(self, arch: Architecture) -> str | None:
        return "a LoRA adapter cannot change a bias, which is what a steer edit adds to; ship the baked checkpoint"

    def card_row(self, where: str) -> tuple[str, str, str, str, str]:
        return (
            "steer",
            str(self.layer),
            self.module,
            f"c = {self.weight:g}",
            f"{self.weight:g} × direction `{self.vector}` added to {where}",
        )

    def card_tags(self) -> tuple[str, ...]:
        return ("direction-steering", "control-vector")
