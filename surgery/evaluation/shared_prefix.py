"""Batches whose rows begin with the same tokens (a chat template's system turn): that prefix computed once.

Every prompt through a chat template begins with the same tokens (SmolLM2-Instruct's: the system
turn its template inserts, 24 tokens of its 38 to 53). A left-padded batch computes them once a row;
here they run once, in a pass of one row, whose key/value cache is repeated over the batch's rows.
The rows' own tokens follow it right-aligned, the padding between the two::

    [shared prefix | pad … | the row's own tokens]      attention mask  1 … | 0 … | 1 …

Each token gets the position it has in the left-padded batch (positions count the mask's ones, as
``generate`` counts them) and attends to the same tokens, so greedy answers and logits are those of
the left-padded batch up to floating-point summation order (tests/evaluation/test_shared_prefix.py).
A batch of one row, rows that share no token, or a model whose cache is more than plain keys and
values (sliding windows, state-space layers) get the left-padded batch.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# Given a key of the batch's pass (its texts; the prefix pass: ("prefix", texts)): the context the pass
# runs in (evaluation.prefill's recording or replaying of the unedited passes).
Around = Callable[[Hashable], AbstractContextManager[None]]


@dataclass
class Layout:
    """A batch's token rows laid out for one pass: ``ids`` and ``mask`` (B, T) of the whole rows, the
    first ``shared`` columns being the prefix every row holds (0: a left-padded batch)."""

    ids: torch.Tensor
    mask: torch.Tensor
    shared: int

    def positions(self) -> torch.Tensor:
        """Each column's position in its row (the count of unmasked tokens before it; pads: 0)."""
        return (self.mask.long().cumsum(-1) - 1).masked_fill(self.mask == 0, 0)


def layout(rows: Sequence[Sequence[int]], pad: int, share: bool = True) -> Layout:
    """``rows`` (token ids) as one batch: the longest prefix all of them hold, then each row's other
    tokens right-aligned (at least one token a row stays its own: the pass needs a last position)."""
    shared = 0
    if share and len(rows) > 1:
        shortest = min(len(r) for r in rows)
        while shared < shortest - 1 and all(r[shared] == rows[0][shared] for r in rows):
            shared += 1
    width = max(len(r) for r in rows) - shared
    ids = torch.full((len(rows), shared + width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        own = list(row[shared:])
        ids[i, :shared] = torch.tensor(row[:shared], dtype=torch.long)
        ids[i, shared + width - len(own) :] = torch.tensor(own, dtype=torch.long)
        mask[i, :shared] = 1
        mask[i, shared + width - len(own) :] = 1
    return Layout(ids, mask, shared)


def plain_cache(model: nn.Module) -> Any:
    """An empty cache as ``generate`` makes it for ``model``, or None when any of its layers is more
    than plain keys and values (a window, a state): a prefix cache repeated over rows is only that."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    if not getattr(cache, "layers", None) or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    return cache


def prefix_cache(model: nn.Module, lay: Layout, key: Hashable, around: Around | None = None) -> Any:
    """The cache after the shared prefix's pass (one row, then repeated over the batch's rows), or None
    when there is no prefix (``lay.shared`` 0) or the model's cache cannot be shared."""
    cache = plain_cache(model) if lay.shared else None
    if cache is None:
        return None
    device = next(model.parameters()).device
    with torch.inference_mode(), nullcontext() if around is None else around(("prefix", key)):
        model(input_ids=lay.ids[:1, : lay.shared].to(device), cache=cache, use_cache=True, logits_to_keep=1)
    cache.batch_repeat_interleave(lay.ids.shape[0])
    return cache


def shared_layout(model: nn.Module, rows: Sequence[Sequence[int]], pad: int) -> Layout:
    """:func:`layout` of ``rows``, sharing their prefix only where ``model``'s cache can hold it."""
    return layout(rows, pad, share=plain_cache(model) is not None)


def next_token_logprobs(
    model: nn.Module, rows: Sequence[Sequence[int]], pad: int, key: Hashable, around: Around | None = None
) -> torch.Tensor:
    """(B, vocab) fp32 log-softmax of the next token after each of ``rows`` (token ids), in one batch
    with its shared prefix computed once; ``around(key)``: the context its passes run in."""
    lay = shared_layout(model, rows, pad)
    device = next(model.parameters()).device
    cache = prefix_cache(model, lay, key, around)
    start = lay.shared if cache is not None else 0
    # a cache even without a prefix: the recorded pass's cache layers are what a replay puts back
    cache = plain_cache(model) if cache is None else cache
    with torch.inference_mode(), nullcontext() if around is None else around(key):
        out = model(
            input_ids=lay.ids[:, start:].to(device),
            attention_mask=lay.mask.to(device),
            position_ids=lay.positions()[:, start:].to(device),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
    return out.logits[:, -1].float().log_softmax(-1).cpu()
