"""Edge-edit passes resumed from a batch's cached layer inputs, through the model's own layers.

An edge edit whose heads sit in layers L… changes nothing below layer L, and (attention is causal)
nothing before its first query token at any layer. So one baseline pass per batch records what
transformers hands every decoder layer — its input hidden states and keyword arguments (mask,
position embeddings, position ids, exactly as the model built them) — and every layer's keys and
values. An edit then runs only layers L… of the model itself — layer L on every position, the
layers above only on the positions from its first query token on, with the earlier positions'
keys/values read from a cache; the model's tail (final norm, lm_head, soft-cap) comes from the
architecture table. Same numbers as a full pass (up to floating-point summation order; rows the
edit leaves unchanged bit for bit), a fraction of the FLOPs.

A whole-head scale (o_proj slice, :func:`resume_scaled`) changes every position from its layer on:
it reruns the layers from the lowest scaled one on all positions, with the recorded inputs — the
full pass's computation bit for bit, without the layers below.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from ...core.edits import HeadScale, NeuronScale
from ...core.errors import SurgeryError
from ...model.hooks import applied, decoder_layers, model_architecture
from .attention import AttentionPlan, EdgeEdit, active_plan
from .flops import Counter
from .prompts import Batch

# A recorded layer call's cache arguments: a resumed pass replaces them with its own cache.
_CACHE_ARGS = ("cache", "use_cache")
# A layer's tensor arguments that the model computes once per pass, from its inputs alone.
_PASS_INPUTS = ("hidden_states", "position_ids", "attention_mask", "position_embeddings", "input_ids")


@dataclass
class Snapshot:
    """One batch's baseline pass: every decoder layer's call and every layer's keys/values."""

    calls: list[dict[str, Any]]  # per layer: hidden_states and the keyword arguments it got
    keys: list[torch.Tensor]  # per layer: (B, kv heads, T, head_dim)
    values: list[torch.Tensor]
    logits: torch.Tensor  # (B, vocab) at the last position
    length: int
    final: torch.Tensor  # the last decoder layer's output (B, T, hidden)
    inputs: dict[str, Any]  # the model's inputs (a pass that cannot resume runs them in full)

    def nbytes(self) -> int:
        """Bytes of the tensors it holds, each counted once (layers share their mask and positions)."""
        seen: dict[int, int] = {}

        def add(x: Any) -> None:
            if isinstance(x, torch.Tensor):
                seen[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
            elif isinstance(x, (tuple, list)):
                for v in x:
                    add(v)
            elif isinstance(x, dict):
                for v in x.values():
                    add(v)

        add([self.calls, self.keys, self.values, self.logits, self.final, self.inputs])
        return sum(seen.values())

    @property
    def replayable(self) -> bool:
        """Whether every tensor a layer got is an input of the whole pass (positions, masks, token ids),
        so that a layer may rerun from its recorded call. Not so where a layer hands another its output
        (DeepSeek sparse attention's shared indexer layers get the previous layer's top-k keys)."""
        return bool(self.calls) and all(
            not isinstance(v, torch.Tensor) or k in _PASS_INPUTS for call in self.calls for k, v in call.items()
        )

    def without_layers(self) -> Snapshot:
        """Only the model's inputs and the baseline logits: a pass under an edit then runs in full
        (resume_scaled's path for passes that cannot resume), in a few kilobytes instead of every
        layer's inputs, keys and values."""
        # final: a new empty tensor, not a view (a view would keep the whole output's storage alive)
        return replace(
            self,
            calls=[],
            keys=[],
            values=[],
            final=self.final.new_empty((self.final.shape[0], 0, *self.final.shape[2:])),
        )


def tail_logits(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """(B, vocab) logits at the last position of ``hidden``, the last decoder layer's output (B, T,
    hidden), through the model's tail as the architecture table describes it: the hyper-connection
    head (where the model has one), the final norm (a sibling of the layer list), a division by the
    config's logit scaling, a prediction head, lm_head, then the logit multiplier, divisor and
    soft-cap its config sets."""
    arch = model_architecture(model)
    names, cfg, tail = dict(model.named_modules()), model.config.get_text_config(), arch.layout.tail
    root = arch.root_prefix(names)  # "model.layers.{layer}." → "model."

    def sibling(name: str) -> nn.Module:  # a module next to the layer list
        return names[f"{root}{name}"]

    x = hidden[:, -1:]
    if tail.final_head:
        x = sibling(tail.final_head)(x)
    if tail.final_norm:
        x = sibling(tail.final_norm)(x)
    if tail.logit_scaling:
        x = x / getattr(cfg, tail.logit_scaling)
    if tail.pre_head:
        x = names[tail.pre_head](x)
    logits = model.get_output_embeddings()(x)[:, -1]
    if tail.logit_multiplier:
        logits = logits * getattr(cfg, tail.logit_multiplier)
    if tail.logit_divisor:
        logits = logits / getattr(cfg, tail.logit_divisor)
    cap = getattr(cfg, tail.logit_softcap, None) if tail.logit_softcap else None
    return torch.tanh(logits / cap) * cap if cap else logits


def check_tail(model: nn.Module, final: torch.Tensor, logits: torch.Tensor) -> None:
    """Resumed passes compute the logits from the last layer's output themselves (:func:`tail_logits`):
    that must be the model's own computation, or every knockout would be wrong."""
    with torch.inference_mode():
        ours = tail_logits(model, final).to(logits.dtype)
    if not torch.allclose(ours, logits, rtol=1e-4, atol=1e-4 * float(logits.abs().max())):
        raise SurgeryError(
            f"{type(model).__name__} computes its logits from the last decoder layer otherwise than "
            f"surgery/core/architectures/ describes it (final_head, final_norm, logit_scaling, "
            f"pre_head, logit_multiplier, logit_divisor, logit_softcap): extend its row"
        )


def _cache(model: nn.Module, layers: list[tuple[torch.Tensor, torch.Tensor] | tuple[None, None]] | None = None):
    """A cache of plain key/value layers (``layers``: the cached prefix of each) for a pass through the
    model's own layers; None for a model whose cache is more than keys and values (state-space,
    convolution, compressed or indexer state): its passes run every position without a cache."""
    from transformers import DynamicCache

    if not model_architecture(model).kv_cache_only():
        return None
    return DynamicCache(layers) if layers is not None else DynamicCache()


def _by_name(layer: nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """A decoder layer's call as keyword arguments: positional ones named by its forward's
    signature (GPT-2's blocks get cache and mask positionally), ``**kwargs`` flattened; the first
    argument, the hidden states, under "hidden_states" whatever the layer calls it (RecurrentGemma:
    activations), since replays pass it positionally."""
    signature = inspect.signature(layer.forward)
    try:
        bound = signature.bind_partial(*args, **kwargs).arguments
    except TypeError as exc:
        raise SurgeryError(
            f"{type(layer).__name__} was called in a way its forward's signature does not "
            f"allow ({exc}); resumed passes cannot replay it"
        ) from None
    var = next((p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None)
    first = next(iter(signature.parameters))
    named = {**{k: v for k, v in bound.items() if k != var}, **bound.get(var, {})}
    return {"hidden_states": named.pop(first), **named}


@contextmanager
def _recording(layers: list[nn.Module]) -> Iterator[list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = [{} for _ in layers]

    def hook_for(i: int):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            calls[i] = _by_name(module, args, kwargs)

        return hook

    handles = [layer.register_forward_pre_hook(hook_for(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def snapshot(model: nn.Module, batch: Batch, plan: AttentionPlan | None = None, *, for_grad: bool = False) -> Snapshot:
    """The baseline pass of ``batch`` (under ``plan``, e.g. for features), with what resuming needs;
    ``for_grad``: run under no_grad instead of inference mode (the same kernels, the same numbers), so
    that a pass with gradients may resume from it (atp.resumed_attributions)."""
    layers = decoder_layers(model)
    # a cache of plain full-length layers: sliding-window layers keep their window in the mask
    cache = _cache(model)
    final: list[torch.Tensor] = []
    handle = layers[-1].register_forward_hook(
        lambda module, args, out: final.append(out[0] if isinstance(out, (tuple, list)) else out)
    )
    try:
        with torch.no_grad() if for_grad else torch.inference_mode(), active_plan(plan), _recording(layers) as calls:
            out = model(**batch.model_inputs(), cache=cache, use_cache=cache is not None, logits_to_keep=1)
    finally:
        handle.remove()
    check_tail(model, final[0], out.logits[:, -1])
    # without a key/value cache, resumed passes rerun every position: no keys are kept
    return Snapshot(
        calls,
        [cache.layers[i].keys for i in range(len(layers))] if cache is not None else [],
        [cache.layers[i].values for i in range(len(layers))] if cache is not None else [],
        out.logits[:, -1],
        batch.input_ids.shape[1],
        final[0],
        batch.model_inputs(),
    )


def _full_pass(model: nn.Module, snap: Snapshot, counter: Counter | None) -> torch.Tensor:
    """(B, vocab) last-position logits of a full pass over ``snap``'s inputs (under the active plan
    or scales): what a pass that cannot resume computes."""
    with torch.inference_mode():
        logits = model(**snap.inputs, use_cache=False, logits_to_keep=1).logits[:, -1]
    if counter is not None:
        counter.add(logits.shape[0], snap.length)
        counter.add_head(logits.shape[0])
    return logits


def _sliced(call: dict[str, Any], start: int, cache) -> dict[str, Any]:
    """A recorded layer call restricted to the query positions ``start:``, reading ``cache``."""
    if cache is None:  # a model run without a cache (every position): the call as recorded
        return dict(call)
    from transformers import Cache

    out: dict[str, Any] = {}
    for name, v in call.items():
        if name in _CACHE_ARGS:
            continue
        if isinstance(v, Cache):  # the baseline's cache under the layer's own name (GPT-NeoX: layer_past)
            out[name] = cache
        elif name in ("hidden_states", "position_ids"):
            out[name] = v[:, start:]
        elif name == "attention_mask":
            out[name] = None if v is None else v[..., start:, :]
        elif name == "position_embeddings":  # (cos, sin), or one complex tensor (DeepSeek-V2)
            out[name] = v[..., start:, :] if isinstance(v, torch.Tensor) else tuple(t[..., start:, :] for t in v)
        elif isinstance(v, torch.Tensor):
            raise SurgeryError(
                f"a decoder layer got the tensor argument {name!r}, which a resumed pass "
                "does not know how to restrict; extend surgery/find/heads/resume.py"
            )
        else:
            out[name] = v
    named = any(v is cache for v in out.values())
    return {**out, **({} if named else {"cache": cache}), "use_cache": True}


def first_layer(edit: EdgeEdit) -> int | None:
    """The lowest layer ``edit`` changes (None: it changes nothing)."""
    layers = [layer for layer, heads in edit.heads.items() if heads]
    return None if edit.is_identity() or not layers else min(layers)


def first_query(batch: Batch, edit: EdgeEdit) -> int | None:
    """The first padded position of any row's ``edit.queries`` span (None: no row has one)."""
    rows = batch.masks[edit.queries].any(dim=0).nonzero()
    return int(rows[0]) if len(rows) else None


def resume(
    model: nn.Module, snap: Snapshot, batch: Batch, edit: EdgeEdit, counter: Counter | None = None
) -> torch.Tensor:
    """(B, vocab) last-position logits of ``batch`` under ``edit``, from ``snap``'s cached layers.

    The first edited layer runs on every position, as in a full pass, so that its output compares
    bit for bit with the baseline's: a row it leaves unchanged (an edit below float resolution) keeps
    the baseline's logits exactly, as a full pass would. The layers above run from ``start`` on.
    """
    layer, start = first_layer(edit), first_query(batch, edit)
    if layer is None or start is None:
        return snap.logits
    if not snap.replayable:
        with active_plan(AttentionPlan(batch.masks, edit=edit)):
            return _full_pass(model, snap, counter)
    layers, rows = decoder_layers(model), batch.input_ids.shape[0]
    if not snap.keys:  # a state-space or compressed cache: the layers above rerun every position
        start = 0
    cache = _cache(
        model,
        [
            (k[:, :, :start], v[:, :, :start]) if i > layer else (None, None)
            for i, (k, v) in enumerate(zip(snap.keys, snap.values))
        ],
    )
    plan = AttentionPlan(batch.masks, edit=edit)
    last = max(i for i, heads in edit.heads.items() if heads)
    with torch.inference_mode(), active_plan(plan):
        hidden = _layer(layers[layer], snap.calls[layer], 0, cache, snap.calls[layer]["hidden_states"])
        baseline = snap.calls[layer + 1]["hidden_states"] if layer + 1 < len(layers) else snap.final
        changed = (hidden != baseline).flatten(1).any(1)
        if counter is not None:
            counter.add(rows, snap.length, 0, layer, layer + 1)
        plan.start, plan.changed, hidden = start, None, hidden[:, start:]
        for i in range(layer + 1, len(layers)):
            if i > last and not changed.any():
                return snap.logits  # the edit changed nothing, to the last bit
            hidden = _layer(layers[i], snap.calls[i], start, cache, hidden)
            if counter is not None:
                counter.add(rows, snap.length, start, i, i + 1)
            if plan.changed is not None:  # an edited layer above the first changed these rows
                changed, plan.changed = changed | plan.changed, None
        if not changed.any():
            return snap.logits
        logits = tail_logits(model, hidden)
    if counter is not None:
        counter.add_head(rows)
    return torch.where(changed[:, None], logits, snap.logits)


def resume_scaled(
    model: nn.Module, snap: Snapshot, scales: Sequence[HeadScale | NeuronScale], counter: Counter | None = None
) -> torch.Tensor:
    """(B, vocab) last-position logits under whole-head ``scales`` (o_proj input slices; surgery tune
    passes neuron scales too, which change their layer's positions alike), from ``snap``'s cached
    inputs of the lowest scaled layer.

    A head scale changes every position from its layer on, so the layers from the lowest one run on
    all positions, with the recorded inputs of a full pass: the same computation as a full pass,
    without the layers below. The scales are applied (model.hooks.applied) for the duration.
    """
    scales = [s for s in scales if not s.is_identity()]
    if not scales:
        return snap.logits
    if not snap.replayable:
        with applied(model, scales):
            return _full_pass(model, snap, counter)
    first, layers, rows = min(s.layer for s in scales), decoder_layers(model), snap.logits.shape[0]
    cache = _cache(model, [(None, None)] * len(layers))  # filled by the layers that run, as a full pass
    with torch.inference_mode(), applied(model, scales):
        hidden = snap.calls[first]["hidden_states"]
        for i in range(first, len(layers)):
            hidden = _layer(layers[i], snap.calls[i], 0, cache, hidden)
        logits = tail_logits(model, hidden)
    if counter is not None:
        counter.add(rows, snap.length, 0, first)
        counter.add_head(rows)
    return logits


def _layer(layer: nn.Module, call: dict[str, Any], start: int, cache, hidden: torch.Tensor) -> torch.Tensor:
    """One decoder layer on ``hidden`` (positions ``start:``), with the recorded call's arguments."""
    kwargs = _sliced(call, start, cache)
    out = layer(hidden, **{k: v for k, v in kwargs.items() if k != "hidden_states"})
    return out[0] if isinstance(out, (tuple, list)) else out
