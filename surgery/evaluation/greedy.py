"""Greedy answers of a batch whose finished rows leave it: fewer rows a decode step, the same tokens.

``model.generate`` keeps a batch's shape to the end: a row that has its answer (its end-of-sequence
token, or a marker the caller waits for) is decoded on, padded, until every row is done. Here such a
row leaves the batch: each step runs only the rows still answering, their cache rows selected. A row's
tokens are computed as in the full batch: the same inputs, positions, mask and cache entries; only
matrix products of fewer than :data:`MIN_ROWS` rows take another CPU kernel whose sums differ in the
last bits, so a batch never shrinks below that (finished rows fill it, their tokens discarded).

Only plain greedy decoding runs here (no logits processor changes a greedy token: :func:`plain_greedy`);
a model whose generation config asks for one gets ``model.generate`` (evaluation.markers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..model.shared_prefix import Layout

# The fewest rows a decode step runs while more remain: oneDNN/MKL's fp32 matrix products give a row
# the same bits for 4 to 8 rows and other bits for 1 to 3 (measured on SmolLM2's shapes).
MIN_ROWS = 4

# Generation-config fields whose non-default value makes ``generate``'s greedy tokens differ from the
# argmax of the logits (logits processors and forced tokens).
GREEDY_CHANGERS = (
    "repetition_penalty",
    "encoder_repetition_penalty",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "bad_words_ids",
    "min_length",
    "min_new_tokens",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "suppress_tokens",
    "begin_suppress_tokens",
    "sequence_bias",
    "exponential_decay_length_penalty",
    "renormalize_logits",
    "guidance_scale",
    "watermarking_config",
)


def plain_greedy(model: nn.Module) -> bool:
    """Whether ``model``'s greedy generation is the argmax of its logits at every step."""
    from transformers import GenerationConfig

    config, default = getattr(model, "generation_config", None) or GenerationConfig(), GenerationConfig()
    return all(getattr(config, f, None) == getattr(default, f, None) for f in GREEDY_CHANGERS)


def eos_ids(model: nn.Module) -> set[int]:
    """The token ids that end ``model``'s answer (its generation config's, as ``generate`` reads them)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


def greedy_answers(
    model: nn.Module,
    lay: Layout,
    cache: Any,
    max_new_tokens: int,
    done: Callable[[int, list[int]], bool] | None = None,
    keep: Callable[[torch.Tensor], None] | None = None,
) -> list[list[int]]:
    """Each row of ``lay``'s greedy new tokens (up to ``max_new_tokens``; ending at an end-of-sequence
    token, which is kept, or once ``done(row, tokens so far)`` says the row has its answer). ``cache``:
    its shared prefix's (model.shared_prefix), None for none. ``keep(index)``: told which rows (positions
    in the batch that ran) the next step runs, before it runs (model.row_hooks follows its rows)."""
    from transformers import DynamicCache

    device, follow = next(model.parameters()).device, keep
    start = lay.shared if cache is not None else 0
    cache = DynamicCache(config=model.config) if cache is None else cache  # as the model makes its own
    mask, positions = lay.mask.to(device), lay.positions().to(device)
    eos = eos_ids(model)
    rows = list(range(lay.ids.shape[0]))  # the batch's rows, by their index in ``lay``
    answers: list[list[int]] = [[] for _ in rows]
    live = set(rows)
    step_ids = lay.ids[:, start:].to(device)
    step_pos = positions[:, start:]
    for _ in range(max_new_tokens):
        out = model(
            input_ids=step_ids,
            attention_mask=mask,
            position_ids=step_pos,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        tokens = out.logits[:, -1].float().argmax(-1)
        for i, row in enumerate(rows):
            if row in live:
                answers[row].append(int(tokens[i]))
                if answers[row][-1] in eos or (done is not None and done(row, answers[row])):
                    live.discard(row)
        if not live:
            break
        keep = _kept(rows, live)
        if len(keep) < len(rows):
            index = torch.tensor(keep, device=device)
            for layer in cache.layers:
                layer.keys, layer.values = layer.keys[index], layer.values[index]
            rows, tokens, mask, step_pos = [rows[i] for i in keep], tokens[index], mask[index], step_pos[index]
            if follow is not None:
                follow(index)
        mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=-1)
        step_ids, step_pos = tokens[:, None], step_pos[:, -1:] + 1
    return answers


def _kept(rows: Sequence[int], live: set[int]) -> list[int]:
    """Indices (into ``rows``) of the rows the next step runs: the live ones, then finished ones (in
    order) while fewer than :data:`MIN_ROWS` (or all of ``rows``)."""
    keep = [i for i, row in enumerate(rows) if row in live]
    fill = [i for i, row in enumerate(rows) if row not in live]
    keep += fill[: max(0, min(MIN_ROWS, len(rows)) - len(keep))]
    return sorted(keep)
