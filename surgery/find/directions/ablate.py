"""From direction findings to a recipe: which layers, which modules, with which weight and direction.

The weight of layer L follows the kernel abliteration tools use: ``weight`` at ``position``,
falling linearly to ``floor`` at ``width`` layers from it, no edit further away (flat at ``weight``
by default). Each edited layer gets its own direction (``layer.L`` of the vectors file), or every
one the direction of ``direction_layer``. Each of ``modules`` stands for every residual writer of its
side the layer has (``Architecture.residual_writers``): ``attention`` for the attention output and a
hybrid layer's other token mixer (Mamba, linear attention, a short convolution; Falcon-H1 has both),
``mlp`` for the dense MLP's down matrix or, on a mixture-of-experts layer, every routed expert's and
the shared expert's, so no writer is left out; the writers the table cannot project exactly are
named in one line (:func:`unprojected_note`). ``add``: steer edits (b ← b + w·r on those modules'
output biases) instead of projections.
"""

from __future__ import annotations

from typing import Any

from ...core.architectures import Architecture
from ...core.comma_list import comma_items, no_repeats
from ...core.edit_kind import layer_list
from ...core.edits import FolderVectors, Recipe
from ...core.errors import ParameterError
from ..neurons.params import parse_layers
from .find import DirectionFindings
from .params import KernelParams

# Each --modules side → the recipe roles of the residual writers it stands for, in recipe order.
SIDES = {"attention": ("attention", "mixer"), "mlp": ("mlp", "experts", "shared_experts")}
ROLES = tuple(SIDES)


def layer_weights(kernel: KernelParams, num_layers: int, best: int) -> dict[int, float]:
    """The weight of every edited layer (``best``: the peak's position when none is given)."""
    position = best if kernel.position is None else kernel.position
    if position >= num_layers:
        raise ParameterError(
            f"{{position}} {position} is not a layer: the model has layers 0..{num_layers - 1}", "position"
        )
    layers = parse_layers(kernel.layers) or list(range(num_layers))
    if layers[-1] >= num_layers:
        raise ParameterError(
            f"{{layers}} names layer {layers[-1]}, but the model has layers 0..{num_layers - 1}", "layers"
        )
    peak = kernel.weight
    floor = peak if kernel.floor is None else kernel.floor
    width = kernel.width or max(position, num_layers - 1 - position, 1)
    weights = {}
    for layer in layers:
        distance = abs(layer - position)
        if distance <= width:
            weights[layer] = peak + (floor - peak) * distance / width
    if not any(weights.values()):
        raise ParameterError(
            "every weight of the kernel is 0 (or no layer is within {width} of {position}): nothing "
            "would change; give a non-zero {weight}",
            "width",
            "position",
            "weight",
        )
    return weights


def sides(kernel: KernelParams) -> list[str]:
    """The sides ``kernel.modules`` lists (attention, mlp)."""
    names = comma_items(kernel.modules, "modules", "attention,mlp")
    no_repeats(names, "modules", "side")
    bad = [m for m in names if m not in ROLES]
    if bad or not names:
        raise ParameterError(f"{{modules}} must list {' and/or '.join(ROLES)}, got {kernel.modules!r}", "modules")
    return names


def roles(kernel: KernelParams, arch: Architecture, layer: int) -> list[str]:
    """The recipe modules of ``kernel.modules`` in ``layer``: every residual writer of each side the layer has."""
    writers = arch.residual_writers(layer)
    return [role for side in sides(kernel) for role in SIDES[side] if role in writers]


def unprojected_note(kernel: KernelParams, arch: Architecture, layers: list[int]) -> str | None:
    """One line naming the residual writers of ``layers`` on ``kernel``'s sides that the table knows
    but cannot project exactly (None: there are none), e.g. "not projected (the table cannot edit
    them exactly): layers 1, 3: experts (…)"."""
    wanted, by_what = set(sides(kernel)), {}
    for layer in layers:
        for side, what in arch.unprojected_writers(layer):
            if side in wanted:
                by_what.setdefault(what, []).append(layer)
    if not by_what:
        return None
    parts = [f"layers {layer_list(found)}: {what}" for what, found in by_what.items()]
    return "not projected (the table cannot edit them exactly): " + "; ".join(parts)


def direction_recipe(
    found: DirectionFindings, kernel: KernelParams, arch: Architecture
) -> tuple[Recipe, dict[str, Any]]:
    """The recipe of direction edits ``kernel`` asks for, and what surgery.json records about it."""
    n = len(found.layers)
    if kernel.direction_layer is not None and kernel.direction_layer >= n:
        raise ParameterError(
            f"{{direction_layer}} {kernel.direction_layer} is not a layer of the findings (0..{n - 1})",
            "direction_layer",
        )
    tied = found.data.best_layers()
    falls = kernel.floor is not None or kernel.width is not None  # else flat: the peak's place does not matter
    if kernel.position is None and falls and len(tied) > 1:
        raise ParameterError(
            f"{{position}} is needed: layers {layer_list(tied)} of the findings separate the two sets "
            f"equally well ({found.layers[tied[0]].separation:g}), so none is the peak "
            "(one prompt a side has no spread); give {position}, or more prompts a side",
            "position",
        )
    weights = layer_weights(kernel, n, found.data.best_layer)
    edited = [layer for layer, weight in sorted(weights.items()) if weight != 0]
    if not any(roles(kernel, arch, layer) for layer in edited):
        raise ParameterError(
            f"{{modules}} {kernel.modules} names no residual writer the table can project in layers "
            f"{layer_list(edited)} of this {arch.model_type} model; choose other {{layers}} or {{modules}}",
            "modules",
            "layers",
        )
    edits = []
    for layer, weight in sorted(weights.items()):
        if weight == 0:
            continue
        source = layer if kernel.direction_layer is None else kernel.direction_layer
        edits += [
            {
                "type": "steer" if kernel.add else "direction",
                "layer": layer,
                "module": module,
                "weight": weight,
                "vector": f"{found.vectors.name}#layer.{source}",
            }
            for module in roles(kernel, arch, layer)
        ]
    recipe = Recipe.from_dict(
        {"version": 1, "edits": edits}, where="ablate-direction", vectors=FolderVectors(found.vectors.parent)
    )
    record = {
        "direction_findings": found.record(),
        "direction_kernel": {
            "weight": kernel.weight,
            "position": kernel.position,
            "floor": kernel.floor,
            "width": kernel.width,
            "layers": kernel.layers,
            "modules": kernel.modules,
            "direction_layer": kernel.direction_layer,
            "weights": {str(k): v for k, v in sorted(weights.items())},
        },
    }
    if kernel.add:  # written only when set: earlier records stay as they were
        record["direction_kernel"]["add"] = True
    if note := unprojected_note(kernel, arch, edited):
        record["direction_kernel"]["not_projected"] = note
    return recipe, record
