"""Capture of expert neurons in mixture-of-experts layers, over the tokens each expert is routed.

transformers 5 runs all experts of a layer in one module (fused 3-D ``gate_up_proj``/``down_proj``)
that receives the router's own top-k choice (``top_k_index``). A forward hook on that module
recomputes, for each expert, the intermediate activation h = gate(x_routed) (the module's own
``_apply_gate``, its layout flags) over exactly the tokens routed to it, and pools it per prompt
over the prompt's real tokens that reached the expert. A prompt none of whose tokens reached an
expert has no activation for it: NaN, never a silent 0 (the scores count such pairs separately).
A shared expert (Qwen2-MoE) sees every token and is pooled like a dense MLP. Under accelerate's
disk offload the hook runs after the module has sent its weights back to disk: it brings them in
again while it reads them.

Columns of a layer: routed expert e's neuron i is column e·I + i; the shared expert's neuron j is
column E·I + j. Alongside, the routing share: per prompt and expert, the fraction of real tokens
whose top-k includes the expert. A dense MLP layer among the expert layers (DeepSeek's first k, Llama
4's interleaved ones) is captured at its down_proj input like a dense model's: neuron i is column i,
the columns past its width have no neuron (NaN), and it has no routing (NaN).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import torch
from accelerate.utils import align_module_device
from torch import nn

from ...core.architectures import Architecture
from ...core.errors import SurgeryError
from ...core.freed_memory import trim_heap
from ...model.expert_twin import expert_blocks, expert_intermediate, routed_inputs
from ...model.hooks import layer_module, model_architecture
from ...model.placement import input_device

# (index of the batch's first text, pooled [batch, layers, columns], routing share [batch, layers, experts])
ExpertsCallback = Callable[[int, torch.Tensor, torch.Tensor], None]


class _StopForward(Exception):
    """Raised once the last layer's MLP has run: nothing after it is computed."""


def dense_layers(arch: Architecture) -> list[int]:
    """The layers of a mixture of experts whose MLP is dense (no experts)."""
    return [layer for layer in range(arch.geometry.num_layers) if not arch.is_sparse(layer)]


def columns(arch: Architecture) -> int:
    """Columns of a layer in the findings: E·I routed neurons, then the shared expert's (a dense
    layer's neurons fill the first columns)."""
    g = arch.geometry
    return max(g.num_experts * g.expert_size + g.shared_size, g.intermediate_size if dense_layers(arch) else 0)


def _expert_inputs(
    module: nn.Module, args: tuple, kwargs: dict, dispatch: str
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """(expert, its routed tokens' indices, their inputs) of one experts call: the tokens whose top-k
    holds the expert, or in a dense-dispatch module (Llama 4) the nonzero rows of the expert's
    block (the router's score, exactly 0 off the top-k, scales the block's input)."""
    if dispatch == "dense":
        blocks = expert_blocks(module, args[0])
        for e in range(blocks.shape[0]):
            tok = torch.where(blocks[e].any(dim=-1))[0]
            yield e, tok, blocks[e, tok]
        return
    x, index, _ = routed_inputs(module, args, kwargs)
    for e in range(module.gate_up_proj.shape[0]):
        tok = torch.where((index == e).any(dim=-1))[0]
        yield e, tok, x[tok]


def _routed_sums(
    module: nn.Module,
    inputs: Iterable[tuple[int, torch.Tensor, torch.Tensor]],
    dispatch: str,
    prompt: torch.Tensor,
    real: torch.Tensor,
    n_prompts: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per prompt: Σ of each expert's intermediate activation over its routed real tokens
    [prompts, E, I], and how many routed real tokens that was [prompts, E]."""
    num_experts = module.gate_up_proj.shape[0]
    sums, counts = None, torch.zeros(n_prompts, num_experts, dtype=torch.float32, device=prompt.device)
    for e, tok, x in inputs:
        keep = real[tok]
        tok, x = tok[keep], x[keep]
        if not len(tok):
            continue
        h = expert_intermediate(module, e, x, dispatch).float()
        if sums is None:
            sums = torch.zeros(n_prompts, num_experts, h.shape[-1], dtype=torch.float32, device=x.device)
        sums[:, e].index_add_(0, prompt[tok], h)
        counts[:, e].index_add_(0, prompt[tok], torch.ones(len(tok), device=x.device))
    return sums, counts


def capture_experts(
    model: nn.Module,
    tokenizer,
    texts: Sequence[str],
    on_batch: ExpertsCallback,
    *,
    batch_size: int = 32,
    progress: Callable[[int], None] = lambda n: None,
) -> None:
    """Run ``texts`` in batches; hand ``on_batch`` each batch's pooled expert neurons and routing share."""
    if batch_size < 1:
        raise SurgeryError(f"batch size must be ≥ 1, got {batch_size}")
    arch = model_architecture(model)
    g, ex = arch.geometry, arch.layout.experts
    layers, dense = list(range(g.num_layers)), dense_layers(arch)
    width = columns(arch)
    state: dict = {}
    routed: dict[int, torch.Tensor] = {}
    shares: dict[int, torch.Tensor] = {}
    shared: dict[int, torch.Tensor] = {}

    def experts_hook(layer: int):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output) -> None:
            inputs = _expert_inputs(module, args, kwargs, ex.weights.dispatch)
            # after the forward, accelerate has sent offloaded expert weights back to "meta": bring them in
            with align_module_device(module):
                sums, counts = _routed_sums(
                    module, inputs, ex.weights.dispatch, state["prompt"], state["real"], state["n"]
                )
            mean = torch.full((state["n"], g.num_experts, g.expert_size), float("nan"))
            if sums is not None:
                reached = counts > 0
                mean[reached] = (sums[reached] / counts[reached][:, None]).cpu()
            routed[layer] = mean.reshape(state["n"], -1)
            shares[layer] = (counts / state["tokens"]).cpu()

        return hook

    def pooled_hook(into: dict[int, torch.Tensor], layer: int):
        """A down_proj pre-hook pooling its input over the real tokens (a shared expert, a dense MLP)."""

        def hook(module: nn.Module, args: tuple) -> None:
            h = args[0].float().reshape(state["n"], -1, args[0].shape[-1])
            into[layer] = ((h * state["mask"]).sum(dim=1) / state["tokens"]).cpu()

        return hook

    def stop(module: nn.Module, args: tuple, output) -> None:
        raise _StopForward

    handles = []
    try:
        for layer in layers:
            if layer in dense:
                handles.append(
                    layer_module(model, arch, layer, arch.layout.mlp.down_proj).register_forward_pre_hook(
                        pooled_hook(routed, layer)
                    )
                )
                continue
            handles.append(
                layer_module(model, arch, layer, ex.weights.module).register_forward_hook(
                    experts_hook(layer), with_kwargs=True
                )
            )
            if ex.shared and g.shared_size:
                handles.append(
                    layer_module(model, arch, layer, f"{ex.shared.module}.{ex.shared.down}").register_forward_pre_hook(
                        pooled_hook(shared, layer)
                    )
                )
        # stop after the whole last layer: a shared MLP may sit beside the experts' block (Granite)
        names = dict(model.named_modules())
        handles.append(names[arch.layer_prefix(names).format(layer=layers[-1])[:-1]].register_forward_hook(stop))
        device = input_device(model)  # under disk offload the first parameter may sit on "meta"
        for start in range(0, len(texts), batch_size):
            batch = list(texts[start : start + batch_size])
            enc = tokenizer(batch, return_tensors="pt", padding=True, padding_side="right")
            mask = enc["attention_mask"].to(device)
            n, t = mask.shape
            state.update(
                n=n,
                mask=mask.unsqueeze(-1).float(),
                real=mask.reshape(-1).bool(),
                prompt=torch.arange(n, device=device).repeat_interleave(t),
                tokens=mask.sum(dim=1, keepdim=True).clamp(min=1).float(),
            )
            routed.clear(), shares.clear(), shared.clear()
            with torch.inference_mode():
                try:
                    model(input_ids=enc["input_ids"].to(device), attention_mask=mask, use_cache=False)
                except _StopForward:
                    pass
            missing = [
                layer
                for layer in layers
                if layer not in routed or (layer not in dense and ex.shared and g.shared_size and layer not in shared)
            ]
            if missing:
                raise SurgeryError(
                    f"the forward pass never reached the MLPs of layers {missing}; "
                    f"is {arch.model_type} laid out as surgery/core/architectures/ says?"
                )
            no_routing = torch.full((n, g.num_experts), float("nan"))
            rows = [torch.cat([routed[la]] + ([shared[la]] if la in shared else []), dim=-1) for la in layers]
            pooled = torch.stack([_padded(row, width) for row in rows], dim=1)
            routing = torch.stack([shares.get(la, no_routing) for la in layers], dim=1)
            del rows
            routed.clear(), shares.clear(), shared.clear()
            trim_heap()  # the batch's freed activations, before on_batch's arrays (core/freed_memory.py)
            on_batch(start, pooled, routing)
            progress(len(batch))
    finally:
        for h in handles:
            h.remove()


def _padded(row: torch.Tensor, width: int) -> torch.Tensor:
    """[prompts, columns] filled up to ``width`` columns with NaN (columns with no neuron)."""
    return torch.cat([row, row.new_full((row.shape[0], width - row.shape[1]), float("nan"))], dim=-1)
