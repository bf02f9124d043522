"""The run-time twin of routed-expert neuron edits, as a registered experts implementation.

transformers 5 runs the experts of a layer in one module with fused 3-D weights, dispatching its
forward to the function registered under the model's ``experts_implementation`` (eager,
grouped_mm, …). Switching the model to :data:`NAME` runs :func:`twin_forward` instead: it calls the
implementation that was active before, then, for a module with scales, recomputes each edited
expert's neurons on the tokens routed to it (the module's own ``_apply_gate`` and layout flags)
and adds (s − 1)·h_i·w·down[:, i]. It runs *inside* the module's forward, so weights that
accelerate offloads are in place while it reads them.

Llama 4's experts module (``ExpertWeights.dispatch == "dense"``) has no such interface: it runs every
expert on every token, each expert's input block [tokens, H] already scaled by the router's score
(exactly 0 off the token's top-k). Its twin is a forward hook that adds the same correction per
expert block, over all of the block's tokens (an unrouted token's zero input has h = 0).

LongCat-Flash's experts module (``ExpertWeights.dispatch == "looped"``) runs its own loop over the routed
experts, without the interface: its twin is a forward hook that adds the routed correction to the
module's output, from the module's own inputs (tokens, top-k indices, top-k weights).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from ..core.errors import SurgeryError

NAME = "surgery_expert_twin"


def routed_inputs(module: nn.Module, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden states [tokens, H], top-k expert indices, top-k weights) of a fused experts call,
    bound by the forward's own signature (the names differ: GPT-OSS calls them router_indices…)."""
    bound = inspect.signature(module.forward).bind(*args, **kwargs)
    x, index, weights = list(bound.arguments.values())[:3]
    return x, index, weights


def expert_intermediate(module: nn.Module, e: int, x: torch.Tensor, dispatch: str = "routed") -> torch.Tensor:
    """Expert ``e``'s intermediate activation act(gate)·up on the tokens ``x`` [tokens, H], in the
    module's own layout (transposed or not, biased or not, its ``_apply_gate``); a dense-dispatch
    module (Llama 4) has no interface flags: its forward's own math, [E, H, 2I] and act_fn(gate)·up."""
    # in the activations' dtype: compressed-tensors decompresses an int checkpoint's experts into its
    # scales' dtype (bfloat16) while the model computes in float32, and a matmul takes one dtype
    w = module.gate_up_proj[e].to(x.dtype)
    if dispatch in ("dense", "looped"):  # [H, 2I] (Llama 4) or [2I, H] (LongCat-Flash), gate half first
        gate, up = (x @ w if dispatch == "dense" else x @ w.T).chunk(2, dim=-1)
        return up * module.act_fn(gate)
    gate_up = x @ w if module.is_transposed else x @ w.T
    if module.has_bias:
        gate_up = gate_up + module.gate_up_proj_bias[e].to(x.dtype)
    return module._apply_gate(gate_up)


def expert_blocks(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A dense-dispatch experts input [E·tokens, H] as its per-expert blocks [E, tokens, H]."""
    return x.view(module.gate_up_proj.shape[0], -1, x.shape[-1])


def _dense_correction(module: nn.Module, scales: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """A dense-dispatch module's output plus what scaling each expert's edited neurons changes."""
    blocks, out = expert_blocks(module, x), expert_blocks(module, out.clone())
    for e in torch.nonzero((scales != 1).any(dim=1)).flatten().tolist():
        idx = torch.nonzero(scales[e] != 1).flatten()
        h = expert_intermediate(module, e, blocks[e], "dense")[:, idx.to(x.device)]
        out[e] += ((h * (scales[e, idx].to(h) - 1)) @ module.down_proj[e][idx].to(h)).to(out.dtype)  # down: [E, I, H]
    return out.view(-1, x.shape[-1])


@contextmanager
def _dense_twin(modules: Mapping[nn.Module, torch.Tensor]) -> Iterator[None]:
    """Forward hooks adding each dense-dispatch module's correction (weights brought in under offload)."""
    from accelerate.utils import align_module_device

    def hook_for(scales: torch.Tensor):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            with align_module_device(module):
                return _dense_correction(module, scales.to(output.device), args[0], output)

        return hook

    handles = [m.register_forward_hook(hook_for(scales)) for m, scales in modules.items()]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def _looped_twin(modules: Mapping[nn.Module, torch.Tensor]) -> Iterator[None]:
    """Forward hooks adding each looped module's routed correction (weights brought in under offload)."""
    from accelerate.utils import align_module_device

    def hook_for(scales: torch.Tensor):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
            x, index, weights = routed_inputs(module, args, kwargs)
            with align_module_device(module):
                return _correction(module, scales.to(x.device), x, index, weights, output, "looped")

        return hook

    handles = [m.register_forward_hook(hook_for(scales), with_kwargs=True) for m, scales in modules.items()]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _correction(
    module: nn.Module,
    scales: torch.Tensor,
    x: torch.Tensor,
    index: torch.Tensor,
    weights: torch.Tensor,
    out: torch.Tensor,
    dispatch: str = "routed",
) -> torch.Tensor:
    """``out`` plus what scaling the edited neurons of each expert by ``scales`` [E, I] changes."""
    out = out.clone()
    for e in torch.nonzero((scales != 1).any(dim=1)).flatten().tolist():
        idx = torch.nonzero(scales[e] != 1).flatten()
        tok, pos = torch.where(index == e)
        if not len(tok):
            continue
        act = expert_intermediate(module, e, x[tok], dispatch)
        h = act[:, idx.to(act.device)]  # (tokens, edited neurons)
        down = module.down_proj[e]
        transposed = dispatch == "routed" and module.is_transposed  # a looped module's down is [H, I]
        cols = down[idx] if transposed else down[:, idx].T  # (edited neurons, hidden)
        delta = (h * (scales[e, idx].to(h) - 1)) @ cols.to(h)
        out.index_add_(0, tok, (delta * weights[tok, pos, None]).to(out.dtype))
    return out


def twin_forward(module: nn.Module, *args, **kwargs) -> torch.Tensor:
    """The previous experts implementation, plus the scaled neurons' difference where asked."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    inner = ALL_EXPERTS_FUNCTIONS.get_interface(module._surgery_inner, type(module).forward.__wrapped__)
    out = inner(module, *args, **kwargs)
    scales = module.__dict__.get("_surgery_scales")
    if scales is None:
        return out
    x, index, weights = routed_inputs(module, args, kwargs)
    return _correction(module, scales.to(x.device), x, index, weights, out)


@contextmanager
def expert_twin(
    model: nn.Module, modules: Mapping[nn.Module, torch.Tensor], dispatch: str = "routed"
) -> Iterator[None]:
    """Run ``model`` with each experts module of ``modules`` scaled as its [E, I] tensor says
    (``dispatch``: how the family runs its experts, ``ExpertWeights.dispatch``)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if not modules:
        yield
        return
    if dispatch in ("dense", "looped"):
        with _dense_twin(modules) if dispatch == "dense" else _looped_twin(modules):
            yield
        return
    ALL_EXPERTS_FUNCTIONS.register(NAME, twin_forward)
    previous = model.config._experts_implementation
    experts = [m for m in model.modules() if hasattr(m, "gate_up_proj") and hasattr(m, "_apply_gate")]
    try:
        for m in experts:
            m._surgery_inner = previous
        for m, scales in modules.items():
            m._surgery_scales = scales
        model.set_experts_implementation(NAME)
        if model.config._experts_implementation != NAME:
            raise SurgeryError(
                f"{type(model).__name__} cannot switch its experts implementation; the "
                "run-time twin of expert neurons needs transformers' experts interface"
            )
        yield
    finally:
        model.set_experts_implementation(previous)
        for m in experts:
            m.__dict__.pop("_surgery_inner", None)
            m.__dict__.pop("_surgery_scales", None)
