"""Marker-based response rate: how often a model's answers contain one of the user's markers.

The field measures a direction edit's effect this way (e.g. the share of answers that refuse, by
phrases such as "I can't"): each prompt of the user's set goes through the chat template when the
tokenizer has one, the model answers greedily for ``max_new_tokens`` tokens, and an answer counts
when it contains any marker (case-insensitive). Only counts are kept: no prompt, answer or token
is stored or printed. The project ships no such prompt set; the user gives prompts and markers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core import distributed
from ..core.errors import ParameterError, not_a_file
from ..core.prompts import formatted
from ..model.shared_prefix import Around, SharedPrefix, can_share, prefix_cache, shared_layout
from .greedy import greedy_answers, plain_greedy


def read_markers(path: str | Path) -> list[str]:
    """The markers of ``path``: one a line (blank lines skipped)."""
    path = Path(path).expanduser()  # ~ as a shell would: a Python caller's string is not expanded
    if not path.is_file():
        raise ParameterError(
            f"{{markers}}: {path} {not_a_file(path)}; give a text file with one marker a line", "markers"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ParameterError(f"{{markers}}: {path} is not UTF-8 text; give one marker a line", "markers") from None
    markers = [line.strip() for line in text.splitlines() if line.strip()]
    if not markers:
        raise ParameterError(f"{{markers}}: {path} holds no markers; give one marker (a phrase) a line", "markers")
    return markers


def _answers(
    model,
    tokenizer,
    batch: Sequence[str],
    special: bool,
    max_new_tokens: int,
    around: Around | None = None,
    until: Sequence[str] = (),
    prefix: SharedPrefix | None = None,
) -> list[str]:
    """Greedy answers (decoded, special tokens dropped) to the already formatted texts of ``batch``, the
    prefix they share computed once (model.shared_prefix), a finished row leaving the batch
    (evaluation.greedy; ``model.generate`` where that cannot run); ``until``: lower-cased markers that
    end a row's answer once it holds one."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    lay = shared_layout(model, [tokenizer(t, add_special_tokens=special)["input_ids"] for t in batch], pad, prefix)
    cache = prefix_cache(model, lay, tuple(batch), around, prefix)
    with torch.inference_mode(), nullcontext() if around is None else around(tuple(batch)):
        if plain_greedy(model) and can_share(model, padded=False):  # a cache whose rows can be selected
            holds = holds_marker(tokenizer, until)
            rows = greedy_answers(
                model, lay, cache, max_new_tokens, (lambda row, tokens: holds(tokens)) if until else None
            )
            return tokenizer.batch_decode(rows, skip_special_tokens=True)
        start = lay.ids.shape[1]
        from transformers import StoppingCriteriaList

        stop = StoppingCriteriaList([_UntilMarker(tokenizer, start, until)] if until else [])
        out = model.generate(
            input_ids=lay.ids.to(device),
            attention_mask=lay.mask.to(device),
            cache=cache,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            stopping_criteria=stop,
        )
    return tokenizer.batch_decode(out[:, start:], skip_special_tokens=True)


def has_marker(text: str, wanted: Sequence[str]) -> bool:
    """Whether ``text`` holds one of ``wanted`` (lower-cased markers), in any case."""
    text = text.lower()
    return any(m in text for m in wanted)


def holds_marker(tokenizer, wanted: Sequence[str]) -> Callable[[list[int]], bool]:
    """Whether an answer's tokens so far decode to a text holding one of ``wanted`` (lower-cased)."""
    return lambda tokens: has_marker(tokenizer.decode(tokens, skip_special_tokens=True), wanted)


class _UntilMarker:
    """Ends a row's greedy answer once the text it decodes to so far holds a marker: whether the
    answer holds one is then decided. ``generate`` pads a finished row and stops when every row is
    finished; the other rows' tokens are those of the full generation (each row's computation is
    its own, and the batch keeps its shape)."""

    def __init__(self, tokenizer, start: int, wanted: Sequence[str]) -> None:
        self.tokenizer, self.start, self.wanted = tokenizer, start, wanted

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.start :], skip_special_tokens=True)
        held = [has_marker(text, self.wanted) for text in texts]
        return torch.tensor(held, dtype=torch.bool, device=input_ids.device)


def marker_hits(
    model,
    tokenizer,
    prompts: Sequence[str],
    markers: Sequence[str],
    *,
    max_new_tokens: int = 32,
    batch_size: int = 8,
    around: Around | None = None,
    prefix: SharedPrefix | None = None,
) -> np.ndarray:
    """Per prompt (this process's, all of them): whether its greedy answer holds a marker (surgery
    tune's per-prompt rate, whose confidence interval resamples prompts); ``around``: the context each
    batch's generation runs in; ``prefix``: a prefix pass other batches share."""
    texts, special = formatted(tokenizer, tuple(prompts), "auto")
    wanted = [m.lower() for m in markers]
    hits = []
    for start in range(0, len(texts), batch_size):
        batch = texts[start : start + batch_size]
        # A hit is a marker anywhere in the answer: a row that holds one needs no more tokens.
        answers = _answers(model, tokenizer, batch, special, max_new_tokens, around, until=wanted, prefix=prefix)
        hits += [has_marker(answer, wanted) for answer in answers]
    return np.array(hits, dtype=bool)


def marker_rate(
    model,
    tokenizer,
    prompts: Sequence[str],
    markers: Sequence[str],
    *,
    max_new_tokens: int = 32,
    batch_size: int = 8,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """The share of greedy answers that contain a marker, and how many answers hold each marker
    (under torchrun each rank answers its own prompts; the counts are added up)."""
    texts, special = formatted(tokenizer, tuple(prompts), "auto")
    wanted = [m.lower() for m in markers]
    hits, per_marker = 0, np.zeros(len(markers))
    work = distributed.Shard(texts, chunk=batch_size)
    for start in range(0, len(work.units), batch_size):
        batch = work.units[start : start + batch_size]
        for answer in _answers(model, tokenizer, batch, special, max_new_tokens):
            found = [m in answer.lower() for m in wanted]
            hits += any(found)
            per_marker += found
        if progress:
            progress(len(batch))
    work.finish(progress)
    hits, *counts = distributed.all_reduce(np.array([hits, *per_marker]))
    return {
        "rate": float(hits) / len(texts),
        "answers": len(texts),
        "with_marker": int(round(hits)),
        "per_marker": {m: int(round(c)) for m, c in zip(markers, counts)},
        "max_new_tokens": max_new_tokens,
    }
