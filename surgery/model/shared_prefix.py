"""Batches whose rows begin with the same tokens (a chat template's system turn): that prefix computed once.

Every prompt through a chat template begins with the same tokens (SmolLM2-Instruct's: the system
turn its template inserts, 24 tokens of its 38 to 53). A left-padded batch computes them once a row;
here they run once, in a pass of one row, whose keys and values every row of the batch reads (a
view expanded over the rows, not a copy). The rows' own tokens follow it right-aligned, the padding
between the two (the layout ``generate`` continues; find.heads' scoring passes put their rows' own
tokens right behind the prefix instead, padded on the right, through the same prefix pass)::

    [shared prefix | pad … | the row's own tokens]      attention mask  1 … | 0 … | 1 …

Each token gets the position it has in the left-padded batch (positions count the mask's ones, as
``generate`` counts them) and attends to the same tokens, so greedy answers and logits are those of
the left-padded batch up to floating-point summation order (tests/evaluation/test_shared_prefix.py).
A batch of one row, rows that share no token, or a model whose cache layers :data:`SHARING` does
not allow for the layout (sliding windows here, state-space layers anywhere) get the left-padded
batch. Batches that all begin with the same tokens (a tune's behaviour and neutral prompts) can
share one prefix pass (:class:`SharedPrefix`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# Given a key of the batch's pass (its texts; the prefix pass: ("prefix", texts)): the context the pass
# runs in (evaluation.prefill's recording or replaying of the unedited passes).
Around = Callable[[Hashable], AbstractContextManager[None]]

# logits_to_keep for a pass whose logits are never read: no position.
NONE = torch.zeros(0, dtype=torch.long)


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


def common_prefix(rows: Sequence[Sequence[int]]) -> int:
    """Length of the rows' longest common prefix, leaving every row at least its last token (a pass
    needs a last position a row)."""
    limit = min(len(r) for r in rows) - 1
    first = rows[0]
    n = 0
    while n < limit and all(r[n] == first[n] for r in rows):
        n += 1
    return n


@dataclass
class SharedPrefix:
    """A prefix the rows of several batches all begin with (``tokens``), run once for all of them under
    the same edits: ``layers``, its one-row cache layers once run (evaluation runs no batch's prefix
    longer than this one, so one pass serves every batch)."""

    tokens: tuple[int, ...]
    layers: list[Any] | None = None


def layout(rows: Sequence[Sequence[int]], pad: int, share: bool = True, prefix: SharedPrefix | None = None) -> Layout:
    """``rows`` (token ids) as one batch: the longest prefix all of them hold (at most ``prefix``'s
    tokens), then each row's other tokens right-aligned (at least one token a row stays its own: the
    pass needs a last position)."""
    shared = common_prefix(rows) if share and len(rows) > 1 else 0
    shared = min(shared, len(prefix.tokens)) if prefix is not None else shared
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


# Which cache layers (transformers.cache_utils, by exact class: hybrids subclass these; one a layer, as
# ``DynamicCache(config=...)`` makes them) let a prefix's pass be shared by a batch's rows, per layout:
# "padded", padding between the prefix and a row's own tokens (:func:`layout`'s, which ``generate``
# continues), and "unpadded", each row's tokens right behind the prefix (find.heads' scoring passes).
# A sliding window or a chunk is counted in cache indices, not positions: padding inside a row would
# move it, so those layers share a prefix only unpadded, kept full length with the window or chunk
# applied by the mask. Any other layer (a state-space or linear-attention state, an indexer's keys, a
# quantized or offloaded cache) shares none: the rows get the batch without a shared prefix.
SHARING: dict[str, frozenset[str]] = {
    "DynamicLayer": frozenset({"padded", "unpadded"}),
    "DynamicSlidingWindowLayer": frozenset({"unpadded"}),
}


def can_share(model: nn.Module, padded: bool) -> bool:
    """Whether ``model``'s batches may run a prefix once for all their rows (:data:`SHARING`);
    ``padded``: the layout puts padding between the prefix and a row's own tokens."""
    from transformers import DynamicCache

    layers = getattr(DynamicCache(config=model.config), "layers", None) or []
    if not layers:  # no layer kinds known: only a cache that grows plain layers as the model fills them
        return not padded
    want = "padded" if padded else "unpadded"
    return all(want in SHARING.get(type(layer).__name__, ()) for layer in layers)


def empty_cache(model: nn.Module, padded: bool) -> Any:
    """An empty cache of full-length key/value layers (grown as the model fills them), or None where
    :func:`can_share` says no (the model then makes its own)."""
    from transformers import DynamicCache

    return DynamicCache() if can_share(model, padded) else None


def shared_prefix_cache(
    model: nn.Module,
    tokens: Sequence[int],
    rows: int,
    padded: bool,
    key: Hashable = None,
    around: Around | None = None,
    device: torch.device | None = None,
    prefix: SharedPrefix | None = None,
) -> Any:
    """The cache after one pass of ``tokens`` (a prefix's ids), shared by a batch of ``rows`` rows (each
    layer's keys and values expanded over them: a view, no copy; the rows' pass concatenates its own
    behind it), or None when there is no prefix or :func:`can_share` says no. ``around(("prefix",
    key))``: the context the pass runs in; ``device``: the inputs' (default: the first parameter's);
    ``prefix``: where these tokens' pass is kept (run by the first batch that asks, taken by the rest)."""
    cache = empty_cache(model, padded) if len(tokens) else None
    if cache is None:
        return None
    kept = prefix is not None and prefix.tokens == tuple(tokens)
    if kept and prefix.layers is not None:
        # the same pass, same inputs: its layers as that batch got them (a later pass replaces their
        # tensors, never writes into them)
        cache.layers.extend(copy.copy(layer) for layer in prefix.layers)
    else:
        device = next(model.parameters()).device if device is None else device
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=device)
        with torch.inference_mode(), nullcontext() if around is None else around(("prefix", key)):
            # only its keys/values are read: no position's logits (an empty index, so no lm_head work)
            model(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, use_cache=True, logits_to_keep=NONE)
        if kept:
            prefix.layers = [copy.copy(layer) for layer in cache.layers]
    for layer in cache.layers:
        layer.keys = layer.keys.expand(rows, -1, -1, -1)
        layer.values = layer.values.expand(rows, -1, -1, -1)
    return cache


def shared_layout(
    model: nn.Module, rows: Sequence[Sequence[int]], pad: int, prefix: SharedPrefix | None = None
) -> Layout:
    """:func:`layout` of ``rows``, sharing their prefix only where ``model``'s cache can hold it."""
    return layout(rows, pad, share=can_share(model, padded=True), prefix=prefix)


def prefix_cache(
    model: nn.Module, lay: Layout, key: Hashable, around: Around | None = None, prefix: SharedPrefix | None = None
) -> Any:
    """The cache a pass of ``lay``'s rows starts from: its shared prefix's (:func:`shared_prefix_cache`),
    or None when ``lay`` shares none."""
    ids = lay.ids[0, : lay.shared].tolist()
    return shared_prefix_cache(model, ids, lay.ids.shape[0], True, key, around, prefix=prefix)


def logprobs_from(model: nn.Module, lay: Layout, cache: Any) -> torch.Tensor:
    """(B, vocab) fp32 log-softmax of the next token after each row of ``lay``: one pass from ``cache``
    (its shared prefix's, :func:`prefix_cache`; None: from the first token), in the caller's context."""
    start = lay.shared if cache is not None else 0
    # a cache even without a prefix: the recorded pass's cache layers are what a replay puts back
    cache = empty_cache(model, padded=True) if cache is None else cache
    device = next(model.parameters()).device
    out = model(
        input_ids=lay.ids[:, start:].to(device),
        attention_mask=lay.mask.to(device),
        position_ids=lay.positions()[:, start:].to(device),
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1].float().log_softmax(-1).cpu()


def next_token_logprobs(
    model: nn.Module,
    rows: Sequence[Sequence[int]],
    pad: int,
    key: Hashable,
    around: Around | None = None,
    prefix: SharedPrefix | None = None,
) -> torch.Tensor:
    """(B, vocab) fp32 log-softmax of the next token after each of ``rows`` (token ids), in one batch
    with its shared prefix computed once; ``around(key)``: the context its passes run in; ``prefix``:
    a prefix pass other batches share (:class:`SharedPrefix`)."""
    lay = shared_layout(model, rows, pad, prefix)
    cache = prefix_cache(model, lay, key, around, prefix)
    with torch.inference_mode(), nullcontext() if around is None else around(key):
        return logprobs_from(model, lay, cache)
