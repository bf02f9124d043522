"""Brute-force ground truth: the effect of every head on ΔS, one head at a time.

Two ablations per head, each measured on the same prompt pairs:

- *edge*: knock out the identity→item attention edges of that head (the tested slot: R in the
  match prompt, W in the mismatch prompt), as in the paper's causal test;
- *head*: silence the whole head (α = 0 on its o_proj columns, surgery's run-time hook, which is
  checked elsewhere to equal the baked edit).

Effect = (1 − ΔS_ablated / ΔS_base) · 100 %. The heads with the largest effects are the circuit.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from surgery.core.mcq import format_mcq
from tests.planted.reference import EdgeEdit, edge_edits, letter_spelling_ids, positions, s_scores, token_positions
from tests.planted.task import Question, World, question_pair
from tests.planted.train import prompt_of

GROUND_TRUTH_SEED = 100  # the brute-force pairs; training draws from seed + 1, held-out checks from others


def eval_pairs(world: World, seed: int, per_item: int) -> list[tuple[Question, Question]]:
    """``per_item`` seeded match/mismatch pairs for every item."""
    rng = random.Random(seed)
    return [question_pair(world, rng, item) for item in world.items for _ in range(per_item)]


@dataclass
class Prompts:
    """Prompts of some pairs, laid out match, mismatch, match, …, with the token positions of the
    item, the tested identity (R in match, W in mismatch) and the distractor T in each."""

    texts: list[str]
    items: list[list[int]]
    tested: list[list[int]]
    control: list[list[int]]
    item_names: list[str]  # one per pair, for item-level statistics

    @classmethod
    def build(cls, tokenizer, pairs: Sequence[tuple[Question, Question]]) -> Prompts:
        """From the task's own question pairs (positions found by ``reference.positions``)."""
        qs = [q for pair in pairs for q in pair]
        texts = [prompt_of(q) for q in qs]
        where = [positions(tokenizer, t, q) for t, q in zip(texts, qs)]
        slots = [p[0].bound for p in pairs for _ in range(2)]
        return cls(
            texts,
            [w.item for w in where],
            [w.options[s] for w, s in zip(where, slots)],
            [w.options[1 - s] for w, s in zip(where, slots)],
            [p[0].item for p in pairs],
        )

    @classmethod
    def from_spans(
        cls, tokenizer, questions: Sequence[tuple[str, Mapping[str, tuple[int, int]]]], item_names: Sequence[str]
    ) -> Prompts:
        """From (question text, character spans 'item'/'tested'/'control') rows, match/mismatch
        interleaved — e.g. surgery's pairs, measured here with this module's own positions."""
        texts, found = [], {"item": [], "tested": [], "control": []}
        for text, spans in questions:
            prompt = format_mcq(None, text, instruct=False)  # the question starts the base prompt
            offsets = tokenizer(prompt, return_offsets_mapping=True).offset_mapping
            texts.append(prompt)
            for name, rows in found.items():
                rows.append(token_positions(offsets, [spans[name]]))
        return cls(texts, found["item"], found["tested"], found["control"], list(item_names))

    @property
    def n_pairs(self) -> int:
        return len(self.texts) // 2


def s_of(
    model, tokenizer, texts: Sequence[str], edges: Mapping[int, list[EdgeEdit]] | None = None, batch: int = 128
) -> torch.Tensor:
    """S of every prompt, under edge edits whose rows index ``texts`` (right padding; the last real
    position is read)."""
    spellings = letter_spelling_ids(tokenizer)
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            enc = tokenizer(list(texts[i : i + batch]), padding=True, padding_side="right", return_tensors="pt")
            rows = slice(i, i + batch)
            local = {
                layer: [EdgeEdit(e.head, e.queries[rows], e.keys[rows], e.alpha) for e in es]
                for layer, es in (edges or {}).items()
            }
            with edge_edits(local):
                logits = model(**enc).logits
            last = enc.attention_mask.sum(1) - 1
            out.append(s_scores(logits[torch.arange(len(last)), last], spellings))
    return torch.cat(out)


def delta_s(s: torch.Tensor) -> float:
    """Mean S(match) − mean S(mismatch) for S laid out as match, mismatch, match, …"""
    return (s[0::2] - s[1::2]).mean().item()


def effect(ablated: float, base: float) -> float:
    return (1.0 - ablated / base) * 100.0


@dataclass(frozen=True)
class HeadEffect:
    """One head's brute-force effects on ΔS, in percent of the unablated ΔS."""

    layer: int
    head: int
    edge: float  # identity→item edges of the tested identity knocked out
    edge_control: float  # the same for the distractor's tokens
    whole: float  # the whole head silenced (α = 0)


def brute_force(model, tokenizer, prompts: Prompts) -> tuple[float, list[HeadEffect]]:
    """ΔS of the intact model and every head's effects, sorted by the edge effect (largest first).

    ``model`` must be loaded with ``attn_implementation="planted_edges"`` (see reference.register).
    """
    from surgery.core.edits import HeadScale
    from surgery.model.hooks import applied

    cfg = model.config
    base = delta_s(s_of(model, tokenizer, prompts.texts))
    tested, control, items = prompts.tested, prompts.control, prompts.items
    rows = []
    for layer in range(cfg.num_hidden_layers):
        for head in range(cfg.num_attention_heads):
            edge = delta_s(s_of(model, tokenizer, prompts.texts, {layer: [EdgeEdit(head, tested, items)]}))
            ctrl = delta_s(s_of(model, tokenizer, prompts.texts, {layer: [EdgeEdit(head, control, items)]}))
            with applied(model, [HeadScale(layer, head, 0.0)]):
                whole = delta_s(s_of(model, tokenizer, prompts.texts))
            rows.append(HeadEffect(layer, head, effect(edge, base), effect(ctrl, base), effect(whole, base)))
    return base, sorted(rows, key=lambda r: -r.edge)
