"""Run-time twins of the baked edits: forward pre-hooks on o_proj and down_proj.

Scaling o_proj's input columns for head h is the same linear map as scaling its weight columns;
scaling down_proj's input feature i is the same as scaling its column i (and, for factor 0, as
zeroing the gate/up rows, since act(0)·0 = 0). So these hooks are the reference the bake is checked
against.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from typing import Iterable, Iterator

import torch
from torch import nn

from .architectures import Architecture, architecture
from .edits import Edit, HeadScale, NeuronScale


def model_architecture(model: nn.Module) -> Architecture:
    """The table entry for a loaded transformers model."""
    return architecture(model.config.to_dict())


def layer_module(model: nn.Module, arch: Architecture, layer: int, relative: str) -> nn.Module:
    """The submodule ``relative`` (e.g. ``mlp.down_proj``) of decoder layer ``layer``."""
    names = dict(model.named_modules())
    prefix = arch.layer_prefix(names)
    return names[prefix.format(layer=layer) + relative]


def _scale_hook(scales: torch.Tensor):
    """A pre-hook multiplying the last dimension of the module input by ``scales``."""

    def hook(module: nn.Module, args: tuple) -> tuple:
        x = args[0]
        return (x * scales.to(device=x.device, dtype=x.dtype),) + tuple(args[1:])

    return hook


def scale_vectors(arch: Architecture, edits: Iterable[Edit]) -> dict[tuple[str, int], torch.Tensor]:
    """Per (module, layer): the vector of input-feature scales that the edits amount to."""
    g = arch.geometry
    vectors: dict[tuple[str, int], torch.Tensor] = {}
    width = {arch.layout.o_proj: g.num_heads * g.head_dim, arch.layout.down_proj: g.intermediate_size}
    grouped: dict[tuple[str, int], list[Edit]] = defaultdict(list)
    for e in edits:
        module = arch.layout.o_proj if isinstance(e, HeadScale) else arch.layout.down_proj
        grouped[(module, e.layer)].append(e)
    for (module, layer), group in grouped.items():
        v = torch.ones(width[module], dtype=torch.float32)
        for e in group:
            if isinstance(e, HeadScale):
                v[arch.head_columns(e.head)] = e.alpha
            elif isinstance(e, NeuronScale):
                v[e.neuron] = e.factor
        vectors[(module, layer)] = v
    return vectors


@contextmanager
def applied(model: nn.Module, edits: Iterable[Edit]) -> Iterator[nn.Module]:
    """Apply ``edits`` to ``model`` at run time; every hook is removed on exit, even on error."""
    arch = model_architecture(model)
    handles = []
    try:
        for (module, layer), v in scale_vectors(arch, edits).items():
            target = layer_module(model, arch, layer, module)
            handles.append(target.register_forward_pre_hook(_scale_hook(v)))
        yield model
    finally:
        for h in handles:
            h.remove()
