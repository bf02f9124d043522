"""Batched capture of MLP neuron activations, mean-pooled over each prompt's real tokens.

The input of ``down_proj`` is act(gate(x))·up(x): each feature is one neuron's real contribution
(SwiGLU, GeGLU, and Phi-3's fused gate_up alike). Pre-hooks on the down_proj modules named by the
architecture table pool it over the tokens the attention mask marks as real; the forward pass is
stopped right after the last layer needed (no later layers, no lm_head). Results are handed to a
callback batch by batch, so memory does not grow with the number of prompts.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from ...core.errors import SurgeryError
from ...model.hooks import layer_module, model_architecture
from ...model.placement import input_device

# (index of the batch's first text, pooled activations [batch, layers, width] in float32)
BatchCallback = Callable[[int, torch.Tensor], None]


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


def capture_pooled(model: nn.Module, tokenizer, texts: Sequence[str], on_batch: BatchCallback, *,
                   layers: Sequence[int] | None = None, batch_size: int = 32,
                   progress: Callable[[int], None] = lambda n: None) -> None:
    """Run ``texts`` through ``model`` in batches; call ``on_batch`` with each batch's pooled inputs.

    Padding is on the right, so real tokens keep positions 0..n-1 and (causal attention) never see
    a pad token: a batched text gives the same activations as the text alone.
    """
    if batch_size < 1:
        raise SurgeryError(f"batch size must be ≥ 1, got {batch_size}")
    arch = model_architecture(model)
    chosen = needed_layers(model, layers)
    last = chosen[-1]
    state: dict = {}
    pooled: dict[int, torch.Tensor] = {}

    def hook_for(layer: int):
        def hook(module: nn.Module, args: tuple) -> None:
            x = args[0].float()
            pooled[layer] = (x * state["mask"]).sum(dim=1) / state["count"]
            if layer == last:
                raise _StopForward
        return hook

    handles = [layer_module(model, arch, layer, arch.layout.down_proj).register_forward_pre_hook(hook_for(layer))
               for layer in chosen]
    device = input_device(model)
    try:
        for start in range(0, len(texts), batch_size):
            batch = list(texts[start:start + batch_size])
            enc = tokenizer(batch, return_tensors="pt", padding=True, padding_side="right")
            mask = enc["attention_mask"].to(device)
            state["mask"] = mask.unsqueeze(-1).float()
            state["count"] = mask.sum(dim=1, keepdim=True).clamp(min=1).float()
            pooled.clear()
            with torch.inference_mode():
                try:
                    model(input_ids=enc["input_ids"].to(device), attention_mask=mask, use_cache=False)
                except _StopForward:
                    pass
            missing = [layer for layer in chosen if layer not in pooled]
            if missing:  # a model whose forward skips down_proj (e.g. cached-only path): say so
                raise SurgeryError(f"the forward pass never reached down_proj of layers {missing}; "
                                   f"is {arch.model_type} laid out as surgery/core/architectures.py says?")
            on_batch(start, torch.stack([pooled[layer] for layer in chosen], dim=1).cpu())
            progress(len(batch))
    finally:
        for h in handles:
            h.remove()
