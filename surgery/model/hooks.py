"""Run-time twins of the baked edits: forward pre-hooks on the modules of their twin sites.

Scaling a module's input features is the same linear map as scaling its weight columns (an
``"in"`` site of surgery/core/sites.py): o_proj's columns for a head, down_proj's column for a neuron
(and, for factor 0, as zeroing the gate/up rows too, since act(0)·0 = 0). So these hooks are the
reference the bake is checked against.

Routed experts have no module per expert in memory (transformers 5 fuses them into one module with
3-D ``gate_up_proj``/``down_proj``, run by a pluggable experts implementation): their twin is a
registered experts implementation that sees the routed tokens (model/expert_twin.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

import torch
from torch import nn

from ..core.architectures import Architecture, architecture
from ..core.edits import Edit
from ..core.sites import all_sites
from .expert_twin import expert_twin


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
    """Per (module, layer): the vector of input-feature scales of the edits' twin sites (routed experts
    excepted: see :func:`expert_scales`); a grouped linear's (DeepSeek-V4's o_a_proj) is [groups, features]."""
    vectors: dict[tuple[str, int], torch.Tensor] = {}
    for site in all_sites(arch, edits):
        if not site.twin or site.expert is not None:
            continue  # bake-only completeness (a pruned neuron's gate/up rows): no run-time effect
        key = (site.module, site.layer)
        if key not in vectors:  # a grouped linear's input is [..., groups, features]: one row per group
            groups = site.group[1] if site.group else None
            vectors[key] = torch.ones((groups, site.shape[1]) if groups else site.shape[1], dtype=torch.float32)
        if site.group:
            vectors[key][site.group[0], list(site.indices)] = site.scale
        else:
            vectors[key][list(site.indices)] = site.scale
    return vectors


def expert_scales(arch: Architecture, edits: Iterable[Edit]) -> dict[int, torch.Tensor]:
    """Per layer: the [experts, expert width] scales of the routed-expert neurons the edits touch."""
    out: dict[int, torch.Tensor] = {}
    g = arch.geometry
    for site in all_sites(arch, edits):
        if site.twin and site.expert is not None:
            if site.layer not in out:
                out[site.layer] = torch.ones(g.num_experts, g.expert_size, dtype=torch.float32)
            out[site.layer][site.expert, list(site.indices)] = site.scale
    return out


@contextmanager
def applied(model: nn.Module, edits: Iterable[Edit]) -> Iterator[nn.Module]:
    """Apply ``edits`` to ``model`` at run time; every hook is removed on exit, even on error."""
    arch = model_architecture(model)
    edits = list(edits)
    handles = []
    try:
        for (module, layer), v in scale_vectors(arch, edits).items():
            target = layer_module(model, arch, layer, module)
            handles.append(target.register_forward_pre_hook(_scale_hook(v)))
        experts = {layer_module(model, arch, layer, arch.layout.experts.module): scales
                   for layer, scales in expert_scales(arch, edits).items()}
        with expert_twin(model, experts, arch.layout.experts.dispatch if experts else "routed"):
            yield model
    finally:
        for h in handles:
            h.remove()
