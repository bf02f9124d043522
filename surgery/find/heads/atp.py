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
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from .attention import AttentionPlan


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
            p.requires_grad_(True)


def attributions(plan: AttentionPlan, s: torch.Tensor, layers: Sequence[int]) -> np.ndarray:
    """(B, layers, heads) ∂S/∂e of every prompt of the batch (``s``: its S, differentiable) and head
    of ``layers``, from one backward of ΣS; a head S does not depend on gets 0."""
    leaves = [plan.screen[layer] for layer in layers]
    grads = torch.autograd.grad(s.sum(), leaves, allow_unused=True)
    return np.stack(
        [(g if g is not None else torch.zeros_like(leaf)).cpu().numpy() for g, leaf in zip(grads, leaves)], axis=1
    )
