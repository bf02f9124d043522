"""Several direction trials measured in one forward: their rows stacked, each edit on its own rows.

A decode step of a small model reads every weight whatever its rows (SmolLM2-135M at one thread: 111
ms a step for 8 rows, 166 ms for 32), so k trials' answers decoded together cost far less than k
decodes one after the other. Here the k trials' batches are stacked, trial by trial, and each trial's
edit is hooked in on its rows alone (model.row_hooks). What each trial's rows compute is what they
compute alone: the same prompts, layout and positions; the prefix all prompts begin with is each
trial's own pass under its own edit (one row each, as alone); the layers below the trials' lowest
edited one are replayed from the unedited pass, tiled over the trials (evaluation.prefill). Only the
floating-point summation order of the matrix products can differ (a product of 8 rows and one of 32
take different CPU kernels in the decode steps): KLs agree to float tolerance, and a greedy token can
only change where two tokens' logits tie to the last bits (tests/find/test_tune_trial_batch.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from ...core.edits import Edit
from ...evaluation.greedy import greedy_answers, plain_greedy
from ...evaluation.markers import has_marker, holds_marker
from ...evaluation.prefill import Prefills, lowest_layer
from ...model.hooks import applied
from ...model.row_hooks import RowEdits, applied_rows, rows_editable
from ...model.shared_prefix import (
    Around,
    Layout,
    SharedPrefix,
    can_share,
    logprobs_from,
    shared_layout,
    shared_prefix_cache,
)


def batchable(model, edit_sets: Sequence[Sequence[Edit]]) -> bool:
    """Whether ``edit_sets`` can be measured in one batch: more than one, plain greedy answers whose
    finished rows can leave the batch, and edits model.row_hooks twins."""
    return (
        len(edit_sets) > 1
        and plain_greedy(model)
        and can_share(model, padded=False)
        and rows_editable(model, edit_sets)
    )


@dataclass
class TrialBatch:
    """k trials' edits, the context each trial's own passes run in (its prefix pass) and the one the
    stacked passes run in (the unedited passes replayed below the lowest edited layer of any)."""

    model: Any
    edit_sets: list[Sequence[Edit]]
    prefills: Prefills

    @property
    def k(self) -> int:
        return len(self.edit_sets)

    def around_one(self, t: int) -> Around:
        below = lowest_layer(self.model, self.edit_sets[t])
        return partial(self.prefills.replaying, self.model, below=below)

    def around_all(self) -> Around:
        below = min(lowest_layer(self.model, edits) for edits in self.edit_sets)
        return partial(self.prefills.replaying, self.model, below=below, tiles=self.k)

    def rows(self, each: int) -> RowEdits:
        """The trial of each row of the stacked batch (``each`` rows a trial, trial by trial)."""
        return RowEdits(torch.arange(self.k).repeat_interleave(each))

    def stacked(self, lay: Layout) -> Layout:
        return Layout(lay.ids.repeat(self.k, 1), lay.mask.repeat(self.k, 1), lay.shared)

    def prefix_cache(self, lay: Layout, key: Hashable, prefixes: Sequence[SharedPrefix | None]) -> Any:
        """The stacked batch's cache: each trial's prefix pass (under its own edit, one row, as alone;
        kept in its ``prefixes`` entry for its other batches) over its rows; None when ``lay`` shares none."""
        if not lay.shared:
            return None
        ids, rows, caches = lay.ids[0, : lay.shared].tolist(), lay.ids.shape[0], []
        for t, edits in enumerate(self.edit_sets):
            with applied(self.model, edits):
                caches.append(
                    shared_prefix_cache(self.model, ids, 1, True, key, self.around_one(t), prefix=prefixes[t])
                )
        cache = caches[0]
        for i, layer in enumerate(cache.layers):
            layer = copy.copy(layer)
            layer.keys = torch.cat([c.layers[i].keys.expand(rows, -1, -1, -1) for c in caches])
            layer.values = torch.cat([c.layers[i].values.expand(rows, -1, -1, -1) for c in caches])
            cache.layers[i] = layer
        return cache


def answers_held(
    trials: TrialBatch,
    tokenizer,
    texts: Sequence[str],
    special: bool,
    wanted: Sequence[str],
    max_new_tokens: int,
    prefixes: Sequence[SharedPrefix | None],
) -> list[list[bool]]:
    """Per trial, per text of ``texts`` (formatted prompts, one batch): whether its greedy answer holds
    one of ``wanted`` (lower-cased markers); a row that holds one leaves the batch (evaluation.markers)."""
    model = trials.model
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    lay = shared_layout(model, [tokenizer(t, add_special_tokens=special)["input_ids"] for t in texts], pad, prefixes[0])
    key = tuple(texts)
    cache = trials.prefix_cache(lay, key, prefixes)
    holds: Callable[[list[int]], bool] = holds_marker(tokenizer, wanted)
    rows = trials.rows(len(texts))
    with torch.inference_mode(), trials.around_all()(key), applied_rows(model, trials.edit_sets, rows):
        out = greedy_answers(
            model, trials.stacked(lay), cache, max_new_tokens, lambda row, tokens: holds(tokens), keep=rows.keep
        )
    decoded = tokenizer.batch_decode(out, skip_special_tokens=True)
    n = len(texts)
    return [[has_marker(a, wanted) for a in decoded[t * n : (t + 1) * n]] for t in range(trials.k)]


def next_token_logprobs(
    trials: TrialBatch, rows: Sequence[Sequence[int]], pad: int, key: Hashable, prefixes: Sequence[SharedPrefix | None]
) -> list[torch.Tensor]:
    """Per trial: the (B, vocab) fp32 log-softmax of the next token after each of ``rows`` (token ids,
    one batch), as model.shared_prefix.next_token_logprobs gives it under that trial's edit alone."""
    model = trials.model
    lay = shared_layout(model, rows, pad, prefixes[0])
    cache = trials.prefix_cache(lay, key, prefixes)
    with (
        torch.inference_mode(),
        trials.around_all()(key),
        applied_rows(model, trials.edit_sets, trials.rows(len(rows))),
    ):
        logprobs = logprobs_from(model, trials.stacked(lay), cache)
    return list(logprobs.split(len(rows)))
