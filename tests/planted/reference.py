"""Reference measurements written from the paper's definitions, independent of surgery's analysis code.

- S = lp_c − logsumexp(lp_a, lp_b), where lp_x is the logsumexp of the log-probabilities of every
  single-token spelling of option x (``a``, ``A``, ``(a)``, … with or without a leading space).
- Edge knockout: in one head, scores[query ∈ identity tokens, key ∈ item tokens] = finfo.min
  before the softmax; edge-α: out = out_ko + α·(out − out_ko). This module registers its own
  attention function (``planted_edges``) with transformers for that.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from tests.planted.task import LETTERS, Question, identity_text

ATTN_NAME = "planted_edges"


def letter_spelling_ids(tokenizer) -> list[list[int]]:
    """For a, b, c: the ids of every single-token spelling (never ``<unk>``)."""
    out = []
    for x in LETTERS:
        forms = {f"{p}{s}" for p in ("", " ") for s in (x, x.upper(), f"({x})", f"({x.upper()})")}
        ids: set[int] = set()
        for f in forms:
            enc = tokenizer(f, add_special_tokens=False).input_ids
            if len(enc) == 1 and enc[0] != tokenizer.unk_token_id:
                ids.add(enc[0])
        out.append(sorted(ids))
    return out


def s_scores(logits: torch.Tensor, spellings: Sequence[Sequence[int]]) -> torch.Tensor:
    """S for each row of last-position ``logits`` (n, vocab)."""
    logp = torch.log_softmax(logits.float(), -1)
    lp = torch.stack([torch.logsumexp(logp[:, ids], -1) for ids in spellings], -1)
    return lp[:, 2] - torch.logsumexp(lp[:, :2], -1)


def _char_spans(text: str, needle: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(re.escape(needle), text)]


def token_positions(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[int]:
    """Indices of the tokens whose characters overlap any of ``spans``."""
    return [i for i, (a, b) in enumerate(offsets) if b > a and any(a < e and b > s for s, e in spans)]


@dataclass(frozen=True)
class Positions:
    """Token positions in one prompt: the item's, and each option identity's."""

    item: list[int]
    options: tuple[list[int], list[int]]


def positions(tokenizer, prompt: str, question: Question) -> Positions:
    """Item tokens (every mention in the question) and the tokens of option (a) and (b)'s identity."""
    offsets = tokenizer(prompt, return_offsets_mapping=True).offset_mapping
    options_at = prompt.index("\n(a) ")  # the option line follows the question stem
    stem = [(s, e) for s, e in _char_spans(prompt, question.item) if e <= options_at]
    a_start = prompt.index(identity_text(question.options[0]), options_at)
    b_start = prompt.index(identity_text(question.options[1]), a_start + 1)
    spans = [(s, s + len(identity_text(o))) for s, o in zip((a_start, b_start), question.options)]
    return Positions(
        token_positions(offsets, stem), (token_positions(offsets, spans[:1]), token_positions(offsets, spans[1:]))
    )


@dataclass
class EdgeEdit:
    """Per prompt (row): the query and key positions of the edge, and the α applied to it."""

    head: int
    queries: list[list[int]]
    keys: list[list[int]]
    alpha: float = 0.0


_ACTIVE: dict[int, list[EdgeEdit]] = {}


def _edges_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **_,
):
    """Eager attention (Llama: no soft-capping) with the active edge edits of this layer."""
    groups = module.num_key_value_groups
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = torch.softmax(scores, -1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(probs, value)
    for edit in _ACTIVE.get(module.layer_idx, []):
        cut = scores[:, edit.head].clone()
        for row, (qs, ks) in enumerate(zip(edit.queries, edit.keys)):
            if qs and ks:
                cut[row, torch.tensor(qs)[:, None], torch.tensor(ks)[None, :]] = torch.finfo(cut.dtype).min
        ko = torch.matmul(torch.softmax(cut, -1, dtype=torch.float32).to(query.dtype), value[:, edit.head])
        out[:, edit.head] = ko + edit.alpha * (out[:, edit.head] - ko)
    return out.transpose(1, 2).contiguous(), probs


def register() -> None:
    """Make ``attn_implementation="planted_edges"`` available to transformers."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    AttentionInterface.register(ATTN_NAME, _edges_attention)
    AttentionMaskInterface.register(ATTN_NAME, eager_mask)


@contextlib.contextmanager
def edge_edits(edits: Mapping[int, list[EdgeEdit]]) -> Iterator[None]:
    """Apply ``{layer: [EdgeEdit, ...]}`` to a model loaded with ``attn_implementation=planted_edges``."""
    _ACTIVE.clear()
    _ACTIVE.update(edits)
    try:
        yield
    finally:
        _ACTIVE.clear()
