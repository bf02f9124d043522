"""Plain scoring passes that run each batch's common prefix once.

The binding and knowledge prompts repeat long prefixes: the chat template and system prompt, a
question template, the item. Sorted by their token ids, neighbours share most of them (on the
builtin benchmark and on N4 a batch of 8 runs ~30 % fewer tokens than whole prompts batched by
length). A batch's longest common prefix runs once, as one row; its keys/values are then shared
by every row, whose remaining tokens run right-padded behind it, so that every real token keeps
its position (and its sliding window) and no padding sits inside a row. The logits are read at
each row's last real token. Same numbers as full passes up to float summation order.

Only passes without a plan use it: binding features and edge edits need every row's attention
over the whole prompt, in the left-padded layout of prompts.collate.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...core.mcq import Encoded
from ...model.shared_prefix import common_prefix, empty_cache, shared_prefix_cache


def token_order_groups(prompts: Sequence[Encoded], batch_size: int) -> list[list[int]]:
    """Row indices in batches of ``batch_size``, prompts sorted by their token ids (neighbours share
    the longest prefixes); deterministic, so under torchrun a batch is the same in every run."""
    order = sorted(range(len(prompts)), key=lambda i: prompts[i].ids)
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


def last_token_logits(model, rows: Sequence[Encoded], pad_id: int, device: torch.device) -> torch.Tensor:
    """(B, vocab) logits at the last token of every row, their common prefix run once
    (model.shared_prefix; a model that cannot share one: the rows right-padded, no prefix)."""
    ids = [r.ids for r in rows]
    # No padding sits inside a row here: a sliding window's layer shares the prefix too.
    shared = common_prefix(ids)
    cache = shared_prefix_cache(model, ids[0][:shared], len(rows), padded=False, device=device)
    shared = shared if cache is not None else 0
    tails = [row[shared:] for row in ids]
    width = max(len(t) for t in tails)
    batch = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), shared + width), dtype=torch.long)
    mask[:, :shared] = 1
    for b, tail in enumerate(tails):
        batch[b, : len(tail)] = torch.tensor(tail, dtype=torch.long)
        mask[b, shared : shared + len(tail)] = 1
    cache = empty_cache(model, padded=False) if cache is None else cache
    last = torch.tensor([len(t) - 1 for t in tails])
    keep = torch.unique(last)  # the positions whose logits are needed (one per distinct tail length)
    # ``keep`` stays on the CPU: it indexes the last layer's output, which a device map may place on
    # another device than the inputs (PyTorch accepts CPU indices for any device).
    out = model(
        input_ids=batch.to(device), attention_mask=mask.to(device), cache=cache, use_cache=True, logits_to_keep=keep
    )
    where = out.logits.device
    return out.logits[torch.arange(len(rows), device=where), torch.searchsorted(keep, last).to(where)]
