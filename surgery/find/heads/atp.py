"""Attribution patching (AtP*, Kramár et al. 2024) in one forward/backward: every head's first-order
knockout effect on S (surgery.find.heads.screen ranks the heads by it).

The binding prompts' scoring pass runs with gradients on the attention patterns only
(:func:`frozen`: no weight gradient, so the backward costs about one forward). Every head's pattern
is ``P + e·(P_ko − P)`` with a zero leaf ``e`` per prompt and head (attention._screened); ``P_ko``
is the exact knocked-out pattern of that head (its softmax with the tested identity→item scores
masked), so the softmax is not linearised — AtP*'s fix for saturated attention. ``∂S/∂e`` is then
``Σ (P_ko − P)·∂S/∂P``, the first-order change of the prompt's S when that head's edges are knocked
out: ``S_ko ≈ S + ∂S/∂e``. One backward of ΣS over a batch gives every prompt's (prompts are
independent). It is also the derivative of S along the edge scale α at α = 1 (``e = 1 − α``).

Only the query positions from the first tested identity token on depend on any ``e`` (an earlier
position has no tested query), so the pass with gradients (:func:`resumed_attributions`) resumes from
the batch's baseline pass (resume.snapshot, run anyway for S and the features, and kept for the
knockouts): every layer, but only those positions, the earlier keys and values read from its cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from ...core.freed_memory import trim_heap
from ...model.hooks import decoder_layers, model_architecture
from .attention import AttentionPlan, active_plan
from .prompts import Batch
from .resume import Snapshot, _cache, _layer, tail_logits


@contextmanager
def frozen(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` with no parameter asking for a gradient (restored on exit): a backward then
    computes only the gradients of the activations it needs."""
    asked = [p for p in model.parameters() if p.requires_grad]
    for p in asked:
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p in asked:
            # a parameter made in inference mode (accelerate's disk offload loads weights that way) may
            # have its flag set only there
            with torch.inference_mode(p.is_inference()):
                p.requires_grad_(True)


def attributions(plan: AttentionPlan, s: torch.Tensor, layers: Sequence[int]) -> np.ndarray:
    """(B, layers, heads) ∂S/∂e of every prompt of the batch (``s``: its S, differentiable) and head
    of ``layers``, from one backward of ΣS; a head S does not depend on gets 0."""
    leaves = [plan.screen[layer] for layer in layers]
    grads = torch.autograd.grad(s.sum(), leaves, allow_unused=True)
    return np.stack(
        [(g if g is not None else torch.zeros_like(leaf)).cpu().numpy() for g, leaf in zip(grads, leaves)], axis=1
    )


def screen_start(batch: Batch, snap: Snapshot) -> int:
    """The first position the screen's pass with gradients runs: the batch's first tested identity
    token (0 where the model's cache is more than keys and values: every position runs)."""
    rows = batch.masks["tested"].any(dim=0).nonzero()
    return int(rows[0]) if len(rows) and snap.keys else 0


def resumed_attributions(
    model: nn.Module,
    snap: Snapshot,
    batch: Batch,
    score: Callable[[torch.Tensor], torch.Tensor],
    layers: Sequence[int],
    layer_by_layer: bool | None = None,
) -> np.ndarray:
    """:func:`attributions` of ``batch`` from a pass with gradients resumed from ``snap`` (its baseline
    pass, taken ``for_grad``) at :func:`screen_start`: every layer on the positions from there on,
    the keys and values before it from the cache. ``score`` maps (B, vocab) logits to S.

    ``layer_by_layer`` (default: where the model is held below float32 and no layer reads another's keys and
    values, :func:`recomputes`): the backward makes each layer's graph again, a layer at a time
    (:func:`_layer_by_layer`), instead of keeping every layer's activations from the forward."""
    start = screen_start(batch, snap)
    prefixes = [(k[:, :, :start], v[:, :, :start]) for k, v in zip(snap.keys, snap.values)]
    plan = AttentionPlan(batch.masks, screen={}, start=start)
    if layer_by_layer is None:
        layer_by_layer = recomputes(model)
    with frozen(model), torch.enable_grad(), active_plan(plan):
        if layer_by_layer:
            return _layer_by_layer(model, snap, plan, prefixes, score, layers)
        cache = _cache(model, prefixes)
        hidden = snap.calls[0]["hidden_states"][:, start:]
        for layer, call in zip(decoder_layers(model), snap.calls):
            hidden = _layer(layer, call, start, cache, hidden)
        return attributions(plan, score(tail_logits(model, hidden)), layers)


def recomputes(model: nn.Module) -> bool:
    """Whether the screen's backward makes each layer's graph again (:func:`_layer_by_layer`): for a model held
    below float32 (model/upcast.py), whose memory is its file plus one layer widened, where every layer's
    activations kept for the backward would come on top (gpt-oss-20b's shapes, 4 prompts of 465 tokens:
    0.7 GB a layer); not where a layer reads the keys and values another layer cached (its graph spans both)."""
    from ...model.upcast import COMPUTE_ATTR

    return getattr(model, COMPUTE_ATTR, None) is not None and not model_architecture(model).geometry.kv_shared_layers


def _layer_by_layer(
    model: nn.Module,
    snap: Snapshot,
    plan: AttentionPlan,
    prefixes: list[tuple[torch.Tensor, torch.Tensor]],
    score: Callable[[torch.Tensor], torch.Tensor],
    layers: Sequence[int],
) -> np.ndarray:
    """:func:`attributions` with one layer's graph alive at a time. The forward keeps each layer's input (its
    graph dropped); the backward runs each layer again on that input, from the top, and takes the gradients of
    its leaves and its input from the gradient of its output. The layers run as in the whole pass, on the same
    inputs asking for gradients as there (the same kernels: the same values, bit for bit), and the backward of
    a layer is the same graph's: the same gradients, bit for bit (tests/find/heads/test_atp_layers.py)."""
    blocks, start = decoder_layers(model), plan.start

    def run(i: int, hidden: torch.Tensor) -> torch.Tensor:
        # a cache of layer i's prefix alone: the layer appends its positions to it, so each run has its own
        cache = _cache(model, [prefixes[i] if j == i else (None, None) for j in range(len(blocks))])
        return _layer(blocks[i], snap.calls[i], start, cache, hidden)

    def kept(out: torch.Tensor) -> torch.Tensor:  # the output without its graph, asking for a gradient as it did
        return out.detach().requires_grad_(out.requires_grad)

    inputs = [snap.calls[0]["hidden_states"][:, start:]]
    for i in range(len(blocks)):
        inputs.append(kept(run(i, inputs[-1])))  # no reference to the output: its graph goes before the next layer
        # a layer's activations, freed between the small tensors kept, would leave the C heap's pages with the
        # process, and the next layer's widened weights would come on top (core/freed_memory.py)
        trim_heap()
    final = inputs.pop()
    s = score(tail_logits(model, final))
    grads: dict[int, torch.Tensor] = {}
    upstream = torch.autograd.grad(s.sum(), final)[0] if final.requires_grad else None
    del s
    trim_heap()
    for i in reversed(range(len(blocks))):
        if upstream is None:  # S depends on no leaf at or below this layer
            break
        plan.screen.pop(i, None)
        out = run(i, inputs[i])
        leaf = plan.screen.get(i)
        wrt = [t for t in (inputs[i], leaf) if t is not None and t.requires_grad]
        got = dict(zip(map(id, wrt), torch.autograd.grad(out, wrt, upstream, allow_unused=True)))
        del out
        if leaf is not None and got.get(id(leaf)) is not None:
            grads[i] = got[id(leaf)]
        upstream = got.get(id(inputs[i]))
        del got
        trim_heap()
    # a layer whose leaf S does not depend on gets 0, as in :func:`attributions`
    return np.stack([grads.get(layer, torch.zeros_like(plan.screen[layer])).cpu().numpy() for layer in layers], axis=1)
