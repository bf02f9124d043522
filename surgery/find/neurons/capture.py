"""Batched capture of MLP neuron activations, mean-pooled over each prompt's real tokens.

The default site is the input of ``down_proj``, act(gate(x))·up(x): each feature is one neuron's
real contribution (SwiGLU, GeGLU, and Phi-3's fused gate_up alike). The other site, the outputs of
the gate and up projections ([gate | up], 2·I features a layer), is what optipfair's
``analyze_neuron_bias`` scores by default; find-neurons never uses it, examples/bench_optipfair.py
does, to compare with that library on its own terms. Hooks on the modules named by the
architecture table pool the site over the tokens the attention mask marks as real; the forward
pass is stopped right after the last layer needed (no later layers, no lm_head). Results are
handed to a callback batch by batch, so memory does not grow with the number of prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from ...core.errors import SurgeryError
from ...core.freed_memory import trim_heap
from ...model.hooks import layer_module, model_architecture
from ...model.placement import input_device

# (index of the batch's first text, pooled activations [batch, layers, width] in float32)
BatchCallback = Callable[[int, torch.Tensor], None]

DOWN_PROJ_INPUT = "down_proj input"
GATE_UP_OUTPUTS = "gate/up outputs"
SITES = (DOWN_PROJ_INPUT, GATE_UP_OUTPUTS)


class _StopForward(Exception):
    """Raised by the hook on the last needed layer: nothing after it is computed."""


def needed_layers(model: nn.Module, layers: Sequence[int] | None) -> list[int]:
    """The sorted layers to capture (all when ``layers`` is None); out-of-range is an error."""
    n = model_architecture(model).geometry.num_layers
    chosen = sorted(set(range(n) if layers is None else layers))
    bad = [layer for layer in chosen if not 0 <= layer < n]
    if bad or not chosen:
        raise SurgeryError(f"layers {bad or '[]'} do not exist: the model has layers 0..{n - 1}")
    return chosen


def site_modules(model: nn.Module, site: str) -> tuple[str, ...]:
    """The modules (relative to a layer) whose input (down_proj) or outputs (gate, up; or Phi-3's
    fused gate_up, already [gate | up]) make up ``site``, in the order their features are joined."""
    arch = model_architecture(model)
    if site == DOWN_PROJ_INPUT:
        return (arch.layout.mlp.down_proj,)
    if site == GATE_UP_OUTPUTS:
        return arch.mlp_input_modules()
    raise SurgeryError(f"unknown capture site {site!r}; choose one of {', '.join(SITES)}")


def capture_pooled(
    model: nn.Module,
    tokenizer,
    texts: Sequence[str],
    on_batch: BatchCallback,
    *,
    layers: Sequence[int] | None = None,
    batch_size: int = 32,
    site: str = DOWN_PROJ_INPUT,
    progress: Callable[[int], None] = lambda n: None,
) -> None:
    """Run ``texts`` through ``model`` in batches; call ``on_batch`` with each batch's pooled ``site``.

    Padding is on the right, so real tokens keep positions 0..n-1 and (causal attention) never see
    a pad token: a batched text gives the same activations as the text alone.
    """
    if batch_size < 1:
        raise SurgeryError(f"batch size must be ≥ 1, got {batch_size}")
    arch = model_architecture(model)
    modules = site_modules(model, site)
    chosen = needed_layers(model, layers)
    last = chosen[-1]
    slot = {layer: k for k, layer in enumerate(chosen)}
    state: dict = {}
    # Each module's pooled site for the batch, [batch, layers, width]: made at its first layer and filled
    # in place. A small tensor kept per layer instead sits among the layer's freed activations and widened
    # weights, and the heap grows by a batch's activations at every layer (80 MB over SmolLM2's 30).
    pooled: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, str]] = set()

    def keep(layer: int, name: str, x: torch.Tensor) -> None:
        # [batch, tokens, width]; OPT runs its MLP on the tokens flattened to [batch · tokens, width]
        x = x.reshape(*state["mask"].shape[:2], x.shape[-1])
        if name not in pooled:
            pooled[name] = torch.empty(x.shape[0], len(chosen), x.shape[-1], device=x.device)
        pooled[name][:, slot[layer]] = (x.float() * state["mask"]).sum(dim=1) / state["count"]
        seen.add((layer, name))
        if layer == last and all((last, m) in seen for m in modules):
            raise _StopForward

    def hook_for(layer: int, name: str):
        if site == DOWN_PROJ_INPUT:
            return lambda module, args: keep(layer, name, args[0])
        return lambda module, args, output: keep(layer, name, output)

    handles = []
    for layer in chosen:
        for name in modules:
            module = layer_module(model, arch, layer, name)
            register = module.register_forward_pre_hook if site == DOWN_PROJ_INPUT else module.register_forward_hook
            handles.append(register(hook_for(layer, name)))
    device = input_device(model)
    try:
        for start in range(0, len(texts), batch_size):
            batch = list(texts[start : start + batch_size])
            enc = tokenizer(batch, return_tensors="pt", padding=True, padding_side="right")
            mask = enc["attention_mask"].to(device)
            state["mask"] = mask.unsqueeze(-1).float()
            state["count"] = mask.sum(dim=1, keepdim=True).clamp(min=1).float()
            pooled.clear()
            seen.clear()
            with torch.inference_mode():
                try:
                    model(input_ids=enc["input_ids"].to(device), attention_mask=mask, use_cache=False)
                except _StopForward:
                    pass
            missing = sorted({layer for layer in chosen for m in modules if (layer, m) not in seen})
            if missing:  # a model whose forward skips the site (e.g. cached-only path): say so
                raise SurgeryError(
                    f"the forward pass never reached {site} of layers {missing}; "
                    f"is {arch.model_type} laid out as surgery/core/architectures/ says?"
                )
            batch_pooled = torch.cat([pooled[m] for m in modules], dim=-1).cpu()
            pooled.clear()
            # The batch's freed activations go back before on_batch makes its arrays: the peak is then
            # one batch's, not every batch's heap holes.
            trim_heap()
            on_batch(start, batch_pooled)
            progress(len(batch))
    finally:
        for h in handles:
            h.remove()
