"""From direction findings to a recipe: which layers, which modules, with which weight and direction.

The weight of layer L follows the kernel abliteration tools use: ``weight`` at ``position``,
falling linearly to ``floor`` at ``width`` layers from it, no edit further away (flat at ``weight``
by default). Each edited layer gets its own direction (``layer.L`` of the vectors file), or every
one the direction of ``direction_layer``. ``mlp`` on a mixture-of-experts layer edits every routed
expert's down matrix and the shared expert's, so no expert is left out. ``add``: steer edits
(b ← b + w·r on those modules' output biases) instead of projections.
"""

from __future__ import annotations

from typing import Any

from ...core.architectures import Architecture
from ...core.edits import FolderVectors, Recipe
from ...core.errors import ParameterError
from ..neurons.params import parse_layers
from .find import DirectionFindings
from .params import KernelParams

ROLES = ("attention", "mlp")


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


def roles(kernel: KernelParams, arch: Architecture, layer: int) -> list[str]:
    """The recipe modules of ``kernel.modules`` in ``layer`` (mlp of a MoE layer: its experts)."""
    names = [m.strip() for m in kernel.modules.split(",") if m.strip()]
    bad = [m for m in names if m not in ROLES]
    if bad or not names:
        raise ParameterError(f"{{modules}} must list {' and/or '.join(ROLES)}, got {kernel.modules!r}", "modules")
    out = []
    for name in names:
        if name == "mlp" and arch.is_sparse(layer):
            out += ["experts"] + (["shared_experts"] if arch.layout.experts.shared else [])
        else:
            out.append(name)
    return out


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
    weights = layer_weights(kernel, n, found.data.best_layer)
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
    return recipe, record
