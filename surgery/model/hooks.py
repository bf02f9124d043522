"""Run-time twins of the baked edits: forward pre-hooks on the modules of their twin sites.

Scaling a module's input features is the same linear map as scaling its weight columns (an
``"in"`` site of surgery/core/sites.py): o_proj's columns for a head, down_proj's column for a neuron
(and, for factor 0, as zeroing the gate/up rows too, since act(0)·0 = 0). So these hooks are the
reference the bake is checked against.

Routed experts have no module per expert in memory (transformers 5 fuses them into one module with
3-D ``gate_up_proj``/``down_proj``, run by a pluggable experts implementation): their twin is a
registered experts implementation that sees the routed tokens (model/expert_twin.py).

A projection site (a direction edit, W ← W − w·r(rᵀW)) is twinned by a forward hook on the module
that projects its output, y ← y − w·r(rᵀy): the same map, its bias included. Every routed expert's
down matrix projected is the experts module's output projected (the output is a weighted sum of
the experts' outputs, and the projection is linear). An embedding table that is also the output
head (tied) is projected on that side too: a pre-hook on the head's input, E′h = E(h − w·r(rᵀh)).

An addition site (a steer edit, b ← b + c·r on an output bias) is twinned by a forward hook adding
c·r to the module's output. Every routed expert's down bias plus c·r adds c·r times the sum of the
token's routing weights to the experts module's output (each expert's output, bias included, is
weighted by its routing weight), read from the module's own routed inputs.

Zero-computation experts (LongCat-Flash's identity experts, indices ≥ the routed experts) have no
weights: their weighted input, also in the experts module's output, is left out of both twins.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ..core.architectures import Architecture, architecture
from ..core.edits import Edit
from ..core.errors import RecipeError
from ..core.sites import all_sites
from .expert_twin import expert_twin, routed_inputs


def model_architecture(model: nn.Module) -> Architecture:
    """The table entry for a loaded transformers model."""
    return architecture(model.config.to_dict())


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers, in order, where the architecture table says they are."""
    names = dict(model.named_modules())
    arch = model_architecture(model)
    prefix = arch.layer_prefix(names)
    return [names[prefix.format(layer=i).rstrip(".")] for i in range(arch.geometry.num_layers)]


def layer_module(model: nn.Module, arch: Architecture, layer: int, relative: str) -> nn.Module:
    """The submodule ``relative`` (e.g. ``mlp.down_proj``) of the table's layer ``layer``."""
    names = dict(model.named_modules())
    return names[arch.module_name(arch.layer_prefix(names), layer, relative)]


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
        if not site.twin or site.expert is not None or site.op != "scale":
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


def projections(
    arch: Architecture, edits: Iterable[Edit], op: str = "project"
) -> dict[tuple[str, int | None], tuple[torch.Tensor, float]]:
    """Per (module, layer): the unit vector r and weight w of the edits' projection sites (``op``
    "add": their addition sites); a routed expert's site is its layer's experts module (the kinds
    treat every expert alike)."""
    out: dict[tuple[str, int | None], tuple[torch.Tensor, float]] = {}
    for site in all_sites(arch, edits):
        if site.op == op:
            module = arch.layout.experts.weights.module if site.expert is not None else site.module
            out[(module, site.layer)] = (torch.from_numpy(site.unit().copy()), site.scale)
    return out


def _project(y: torch.Tensor, r: torch.Tensor, w: float) -> torch.Tensor:
    """y − w·r(rᵀy) over the last dimension, computed in float32."""
    r = r.to(device=y.device)
    y32 = y.float()
    return (y32 - (w * (y32 @ r)).unsqueeze(-1) * r).to(y.dtype)


def _project_output(r: torch.Tensor, w: float):
    """A forward hook projecting the module's output (the first element of a tuple output)."""

    def hook(module: nn.Module, args: tuple, output):
        if isinstance(output, tuple):
            return (_project(output[0], r, w),) + output[1:]
        return _project(output, r, w)

    return hook


def _add_output(r: torch.Tensor, c: float):
    """A forward hook adding c·r to the module's output (the first element of a tuple output)."""

    def hook(module: nn.Module, args: tuple, output):
        y = output[0] if isinstance(output, tuple) else output
        y = (y.float() + c * r.to(y.device)).to(y.dtype)
        return (y,) + output[1:] if isinstance(output, tuple) else y

    return hook


def _zero_share(module: nn.Module, args: tuple, kwargs: dict, routed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(each token's routing weights of the experts with weights [tokens, top-k], and what the
    zero-computation experts, indices ≥ ``routed``, pass through [tokens, H]: their weight × the input)."""
    x, index, weights = routed_inputs(module, args, kwargs)
    zero = index >= routed
    passed = (weights.float() * zero).sum(dim=-1, keepdim=True) * x.float()
    return weights.float() * ~zero, passed


def _project_routed(r: torch.Tensor, w: float, routed: int):
    """A forward hook (with kwargs) on an experts module whose router also picks zero-computation experts
    (LongCat-Flash): the routed experts' share of its output projected, what projecting their down
    matrices does; the share the zero-computation experts pass through is left as it is."""

    def hook(module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
        passed = _zero_share(module, args, kwargs, routed)[1]
        return (passed + _project(output.float() - passed, r, w)).to(output.dtype)

    return hook


def _add_routed(r: torch.Tensor, c: float, routed: int):
    """A forward hook (with kwargs) on a routed experts module: c·r times each token's summed routing
    weights (of the ``routed`` experts with weights) added to its output, what c·r in every expert's
    down bias adds."""

    def hook(module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
        weights = _zero_share(module, args, kwargs, routed)[0]
        total = weights.sum(dim=-1, keepdim=True)  # [tokens, 1]
        return (output.float() + c * total * r.to(output.device)).to(output.dtype)

    return hook


def _project_input(r: torch.Tensor, w: float):
    """A pre-hook projecting the module's input (a tied output head)."""

    def hook(module: nn.Module, args: tuple) -> tuple:
        return (_project(args[0], r, w),) + tuple(args[1:])

    return hook


def _module(model: nn.Module, arch: Architecture, layer: int | None, relative: str) -> nn.Module:
    """``relative`` in decoder layer ``layer``, or next to the layer list when ``layer`` is None."""
    if layer is not None:
        return layer_module(model, arch, layer, relative)
    names = dict(model.named_modules())
    return names[arch.root_prefix(names) + relative]


def expert_scales(arch: Architecture, edits: Iterable[Edit]) -> dict[int, torch.Tensor]:
    """Per layer: the [experts, expert width] scales of the routed-expert neurons the edits touch."""
    out: dict[int, torch.Tensor] = {}
    g = arch.geometry
    for site in all_sites(arch, edits):
        if site.twin and site.expert is not None and site.op == "scale":
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
        ex, g = arch.layout.experts, arch.geometry
        for (module, layer), (r, w) in projections(arch, edits).items():
            target = _module(model, arch, layer, module)
            if ex is not None and module == ex.weights.module and g.zero_experts:
                handles.append(target.register_forward_hook(_project_routed(r, w, g.num_experts), with_kwargs=True))
            else:
                handles.append(target.register_forward_hook(_project_output(r, w)))
            head = model.get_output_embeddings()
            if layer is None and head is not None and head.weight is getattr(target, "weight", None):
                handles.append(head.register_forward_pre_hook(_project_input(r, w)))  # tied: the same table
        for (module, layer), (r, c) in projections(arch, edits, "add").items():
            target = _module(model, arch, layer, module)
            if ex is None or module != ex.weights.module:
                handles.append(target.register_forward_hook(_add_output(r, c)))
            elif ex.weights.dispatch != "dense":
                handles.append(target.register_forward_hook(_add_routed(r, c, g.num_experts), with_kwargs=True))
            else:  # Llama 4's experts run every expert on every token, and store no bias to add to
                raise RecipeError(f"steer: {arch.model_type}'s routed experts have no down bias to add to; steer mlp")
        experts = {
            layer_module(model, arch, layer, arch.layout.experts.weights.module): scales
            for layer, scales in expert_scales(arch, edits).items()
        }
        with expert_twin(model, experts, arch.layout.experts.weights.dispatch if experts else "routed"):
            yield model
    finally:
        for h in handles:
            h.remove()
