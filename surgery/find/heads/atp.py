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

from ...model.hooks import decoder_layers
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
) -> np.ndarray:
    """:func:`attributions` of ``batch`` from a pass with gradients resumed from ``snap`` (its baseline
    pass, taken ``for_grad``) at :func:`screen_start`: every layer on the positions from there on,
    the keys and values before it from the cache. ``score`` maps (B, vocab) logits to S."""
    start = screen_start(batch, snap)
    cache = _cache(model, [(k[:, :, :start], v[:, :, :start]) for k, v in zip(snap.keys, snap.values)])
    plan = AttentionPlan(batch.masks, screen={}, start=start)
    with frozen(model), torch.enable_grad(), active_plan(plan):
        hidden = snap.calls[0]["hidden_states"][:, start:]
        for layer, call in zip(decoder_layers(model), snap.calls):
            hidden = _layer(layer, call, start, cache, hidden)
        return attributions(plan, score(tail_logits(model, hidden)), layers)
