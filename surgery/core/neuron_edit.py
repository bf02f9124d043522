"""The ``neuron`` edit kind: scale one MLP neuron (dense, routed expert or shared expert); 0 prunes it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .architectures import TABLE_LOCATION
from .comma_list import comma_items, no_repeats
from .edit_kind import Edit, check_layer, check_scale, index, layer_list, number, recipe_key, register_edit_kind
from .errors import RecipeError
from .sites import Site

if TYPE_CHECKING:
    from .architectures import Architecture

# The ``expert`` of a shared-expert neuron (Qwen2-MoE), in recipes and in the notation L:s:N.
SHARED = "shared"


def expert_index(value: Any, where: str) -> int | str:
    """A routed expert's index, or ``shared``."""
    return value if value == SHARED else index(value, where)


def neuron_label(layer: int, neuron: int, expert: int | str | None = None) -> str:
    """The one notation of a neuron: ``28:17``, ``3:e5:17`` (routed expert 5), ``3:s:17`` (shared)."""
    if expert is None:
        return f"{layer}:{neuron}"
    return f"{layer}:{'s' if expert == SHARED else f'e{expert}'}:{neuron}"


@register_edit_kind
@dataclass(frozen=True)
class NeuronScale(Edit):
    """Scale MLP neuron ``neuron`` of ``layer`` by ``factor``; 0 prunes it (gate/up rows too).

    In a mixture-of-experts layer ``expert`` names the routed expert (an index) or ``"shared"``;
    the notation is ``L:N`` (dense), ``L:eE:N`` (routed expert E), ``L:s:N`` (shared expert).
    """

    kind: ClassVar[str] = "neuron"
    scale_key: ClassVar[str] = "factor"
    keys: ClassVar[tuple[str, ...]] = ("layer", "expert", "neuron", "factor")

    layer: int = recipe_key(index)
    neuron: int = recipe_key(index)
    factor: float = recipe_key(number)
    expert: int | str | None = recipe_key(expert_index, default=None)

    @property
    def target(self) -> tuple[str, int, int, int | str | None]:
        return ("neuron", self.layer, self.neuron, self.expert)

    @property
    def label(self) -> str:
        return neuron_label(self.layer, self.neuron, self.expert)

    @property
    def scale(self) -> float:
        return self.factor

    @property
    def setting(self) -> str:
        return f"{self.factor}"

    @property
    def routed(self) -> bool:
        """A routed expert's neuron (not a dense or shared-expert one)."""
        return self.expert not in (None, SHARED)

    def is_identity(self) -> bool:
        return self.factor == 1.0

    def validate(self, arch: Architecture, where: str) -> None:
        """The neuron exists: in the dense MLP, the routed expert or the shared expert its layer has."""
        check_scale(self.factor, where)
        check_layer(arch, self.layer, where)
        g, ex = arch.geometry, arch.layout.experts
        L, N = self.layer, self.neuron
        if self.expert is None:
            if arch.is_sparse(L) and L not in arch.dense_mlp_layers():
                # both spellings: `where` is a --neurons item or a recipe's edit
                raise RecipeError(
                    f"{where}: layer {L} is a mixture of experts; name the expert "
                    f"({L}:eE:{N} or a recipe's `expert: E` for routed expert E"
                    f"{f', {L}:s:{N} or `expert: shared` for the shared expert' if ex.shared else ''})"
                )
            check_dense_mlp(arch, L, where)
            # the family's own key (OPT's ffn_dim); a family that derives the width has none
            what = arch.layout.config.keys.intermediate_size or "the MLP width"
            width = arch.at(L).geometry.intermediate_size
        elif ex is None and arch.geometry.mlp_kinds and L not in arch.dense_mlp_layers():
            raise RecipeError(
                f"{where}.expert = {self.expert} but surgery does not edit the experts of this "
                f"{arch.model_type} model (its table row has none); extend {TABLE_LOCATION}"
            )
        elif not arch.is_sparse(L):
            raise RecipeError(
                f"{where}.expert = {self.expert} but layer {L} is a dense MLP (no experts); drop the expert "
                f"({L}:{N}, or a recipe's edit without `expert`)"
            )
        elif self.expert == SHARED:
            if not ex.shared or not g.shared_size:  # a family whose config may set no shared expert (width 0)
                raise RecipeError(
                    f"{where}.expert = shared but {arch.model_type} has no shared expert"
                    f"{' (config.json sets its width to 0)' if ex.shared else ''}"
                )
            width, what = g.shared_size, ex.shared.size_key
        else:
            if g.num_experts <= self.expert < g.num_experts + g.zero_experts:
                raise RecipeError(
                    f"{where}.expert = {self.expert} is one of {arch.model_type}'s zero-computation experts "
                    f"({ex.keys.zero_key} = {g.zero_experts}, after the {g.num_experts} routed ones): it passes its input "
                    f"through and has no weights to edit; name a routed expert (0..{g.num_experts - 1})"
                )
            if self.expert >= g.num_experts:
                raise RecipeError(
                    f"{where}.expert = {self.expert} but the model has {g.num_experts} experts "
                    f"per layer (valid: 0..{g.num_experts - 1})"
                )
            width, what = g.expert_size, ex.keys.size_key
        if N >= width:
            raise RecipeError(f"{where}.neuron = {N} but the model has {what} = {width} (valid: 0..{width - 1})")

    def sites(self, arch: Architecture) -> list[Site]:
        """A neuron is one input column of down_proj; pruned, also its rows of every MLP input matrix."""
        if self.expert == SHARED:
            return self._shared_sites(arch)
        if self.expert is not None:
            return self._expert_sites(arch)
        arch = arch.at(self.layer)  # its layer's width (Gemma 4's double-wide layers)
        shapes = arch.mlp_shapes()
        down = arch.layout.mlp.down_proj
        out = [Site(self.layer, down, "in", (self.neuron,), self.factor, shapes[down], True)]
        if self.factor == 0.0 and arch.layout.mlp.prune_inputs:  # see Mlp.prune_inputs
            out += [
                Site(self.layer, m, "out", arch.neuron_rows(m, self.neuron), 0.0, shapes[m], False)
                for m in arch.mlp_input_modules()
            ]
        return out

    def _expert_sites(self, arch: Architecture) -> list[Site]:
        """A routed expert's neuron: the same rule as a dense neuron, on that expert's matrices."""
        g, module = arch.geometry, arch.layout.experts.weights.module
        H, I = g.hidden_size, g.expert_size
        out = [Site(self.layer, f"{module}.down", "in", (self.neuron,), self.factor, (H, I), True, self.expert)]
        if self.factor == 0.0:
            out += [
                Site(self.layer, f"{module}.{part}", "out", (self.neuron,), 0.0, (I, H), False, self.expert)
                for part in ("gate", "up")
            ]
        return out

    def _shared_sites(self, arch: Architecture) -> list[Site]:
        """A shared-expert neuron: a dense neuron of the shared expert's own MLP."""
        g, ex = arch.geometry, arch.layout.experts
        H, I = g.hidden_size, g.shared_size
        out = [
            Site(self.layer, f"{ex.shared.module}.{ex.shared.down}", "in", (self.neuron,), self.factor, (H, I), True)
        ]
        if self.factor == 0.0:
            rows, shape = arch.shared_rows(self.neuron), arch.shared_input_shape()
            out += [
                Site(self.layer, f"{ex.shared.module}.{m}", "out", rows, 0.0, shape, False) for m in ex.shared.inputs
            ]
        return out

    def lora_refusal(self, arch: Architecture) -> str | None:
        # Routed experts are fused 3-D parameters in memory: no Linear for a LoRA to sit on, and
        # vLLM serves no adapter on them. Refusing beats an adapter that silently drops the edit.
        if self.routed:
            return "routed-expert neuron edits have no exact LoRA adapter; ship the baked checkpoint instead"
        return None

    def card_row(self, where: str) -> tuple[str, str, str, str, str]:
        if self.factor == 0:
            effect = f"neuron pruned (zeroed: {where})"
        else:
            effect = f"neuron output × {self.factor:g} ({where})"
        if self.expert is None:
            what = "MLP neuron"
        else:  # the notation of recipes and --neurons: 3:e5:17 (routed expert 5), 3:s:17 (shared)
            what = (
                "shared-expert neuron" if self.expert == SHARED else f"expert {self.expert} neuron"
            ) + f" (`{self.label}`)"
        return (what, str(self.layer), str(self.neuron), f"{self.factor:g}", effect)

    def card_tags(self) -> tuple[str, ...]:
        return ("neuron-pruning",) if self.factor == 0 else ("neuron-scaling",)


def check_dense_mlp(arch: Architecture, layer: int, where: str) -> None:
    """``layer`` has a dense MLP (a hybrid model's state-space, attention-only or expert layers have none)."""
    if layer not in arch.dense_mlp_layers():
        kind = arch.geometry.mlp_kinds[layer]
        raise RecipeError(
            f"{where}.layer = {layer} is a '{kind}' layer of this {arch.model_type} model: it has no "
            f"dense MLP (dense MLP neurons are in layers {layer_list(arch.dense_mlp_layers())})"
        )


def parse_neuron(text: str) -> tuple[int, int, int | str | None]:
    """``"28:17"`` → (28, 17, None); ``"3:e5:17"`` → (3, 17, 5); ``"3:s:17"`` → (3, 17, "shared")."""
    fields = text.split(":")
    try:
        expert: int | str | None = None
        if len(fields) == 3 and fields[1] == "s":
            expert = SHARED
        elif len(fields) == 3 and fields[1][:1] == "e" and fields[1][1:].isdigit():
            expert = int(fields[1][1:])
        elif len(fields) != 2:
            raise ValueError(text)
        layer, neuron = int(fields[0]), int(fields[-1])
    except ValueError:
        raise RecipeError(
            f"'{text}' is not LAYER:NEURON, LAYER:eEXPERT:NEURON or LAYER:s:NEURON (e.g. 28:17, 3:e5:17, 3:s:17)"
        ) from None
    return layer, neuron, expert


def parse_neurons(spec: str, factor: float) -> list[NeuronScale]:
    """Parse ``"28:17,3:e5:17,3:s:2"`` (see :func:`neuron_label`), as the command line and the API take
    it; an empty item or a neuron named twice is refused."""
    out = []
    for part in comma_items(spec, "neurons", "28:17,28:901", RecipeError):
        try:
            layer, neuron, expert = parse_neuron(part)
        except RecipeError as exc:
            # the placeholder reads "neurons" in Python and "--neurons" on the command line
            raise RecipeError(f"{{neurons}}: {exc}", "neurons") from None
        out.append(NeuronScale(layer, neuron, factor, expert))
    if not out:
        raise RecipeError("{neurons} is empty; give LAYER:NEURON pairs such as 28:17,28:901", "neurons")
    no_repeats((e.label for e in out), "neurons", "neuron", RecipeError)
    return out
