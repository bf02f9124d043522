"""Factorial prompt pairs (docs/methods/binding-heads.md): one stem rendered with R ("match") and
with W ("mismatch").

For two items that share no identity (nor a declared culture), with related identities r1 and r2,
a *couple* of pairs is made: item 1 asked with r1 (match) vs r2 (mismatch), and item 2 asked with
r2 (match) vs r1 (mismatch); the other option is a distractor T related to neither item. Working in
couples makes every identity appear exactly as often as "correct" as as "wrong" by construction;
a per-identity cap spreads the pairs over all identities. Everything is drawn from one seeded
generator, so a seed reproduces the pairs exactly.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from .benchmark import Benchmark, BenchmarkError, Item, Stem, display, norm_identity

KNOWLEDGE_STEM = "Which of the following cultural identities is most associated with "
KNOWLEDGE_EQUAL = "Neither is particularly associated"
# Each identity is "correct" at most this many times: with the 66 N4 items this gives a few
# hundred to a thousand pairs (the paper used 847), enough for item-level t-tests.
DEFAULT_PER_IDENTITY = 12


@dataclass(frozen=True)
class Question:
    """An N4-format question and the character spans of its parts.

    spans: 'a', 'b' (option texts), 'item' (absent when the stem does not name the item),
    'tested' (the option holding R or W), 'control' (the option holding T).
    """

    text: str
    spans: dict[str, tuple[int, int]]


@dataclass(frozen=True)
class Pair:
    """One factorial pair and its two knowledge probes."""

    item: str
    qtype: int
    related: str  # R, shown in the match question
    wrong: str  # W, the related identity of another item, shown in the mismatch question
    distractor: str  # T, the other option of both questions
    slot: int  # 0: R/W is option (a), 1: option (b)
    wrong_item: str  # the item W is related to
    match: Question
    mismatch: Question
    k_match: Question
    k_mismatch: Question

    def to_dict(self) -> dict[str, Any]:
        return {
            "item": self.item,
            "qtype": self.qtype,
            "related": self.related,
            "wrong": self.wrong,
            "distractor": self.distractor,
            "slot": "ab"[self.slot],
            "wrong_item": self.wrong_item,
            "match": self.match.text,
            "mismatch": self.mismatch.text,
        }


def render(
    stem_text: str, item_span: tuple[int, int] | None, first: str, second: str, equal: str, slot: int
) -> Question:
    """``stem\\n(a) first (b) second (c) equal`` with the spans of its parts."""
    head = f"{stem_text}\n(a) "
    a = (len(head), len(head) + len(first))
    mid = f"{head}{first} (b) "
    b = (len(mid), len(mid) + len(second))
    text = f"{mid}{second} (c) {equal}"
    spans = {"a": a, "b": b, "tested": (a, b)[slot], "control": (a, b)[1 - slot]}
    if item_span is not None:
        spans["item"] = item_span
    return Question(text, spans)


def knowledge(item: str, first: str, second: str, slot: int) -> Question:
    """The knowledge probe K with the same (a)/(b) identities."""
    return render(
        f"{KNOWLEDGE_STEM}{item}?",
        (len(KNOWLEDGE_STEM), len(KNOWLEDGE_STEM) + len(item)),
        first,
        second,
        KNOWLEDGE_EQUAL,
        slot,
    )


def make_pair(item: Item, stem: Stem, related: str, wrong: str, wrong_item: str, distractor: str, slot: int) -> Pair:
    """Render match, mismatch and both knowledge probes of one pair."""

    def options(identity: str) -> tuple[str, str]:
        pair = [display(distractor)] * 2
        pair[slot] = display(identity)
        return pair[0], pair[1]

    m, mm = options(related), options(wrong)
    return Pair(
        item.name,
        stem.qtype,
        related,
        wrong,
        distractor,
        slot,
        wrong_item,
        render(stem.text, stem.item_span, *m, stem.equal, slot),
        render(stem.text, stem.item_span, *mm, stem.equal, slot),
        knowledge(item.name, *m, slot),
        knowledge(item.name, *mm, slot),
    )


def _distractor(
    pool: dict[str, tuple[str, set[int]]], items: tuple[Item, ...], i: int, j: int, usage: Counter, rng: random.Random
) -> str | None:
    """The least-used identity related to neither item (nor to an item of their cultures)."""
    banned = items[i].related_keys() | items[j].related_keys()
    cultures = {items[i].culture, items[j].culture} - {None}
    eligible = [
        k
        for k, (_, owners) in pool.items()
        if k not in banned and not any(items[o].culture in cultures for o in owners)
    ]
    if not eligible:
        return None
    low = min(usage[k] for k in eligible)
    return rng.choice(sorted(k for k in eligible if usage[k] == low))


def build_pairs(
    bench: Benchmark, seed: int = 0, per_identity: int = DEFAULT_PER_IDENTITY, max_pairs: int | None = None
) -> list[Pair]:
    """Balanced, seeded factorial pairs (see the module docstring).

    ``max_pairs`` keeps a random subset of whole couples, so the balance survives.
    """
    if per_identity < 1:
        raise BenchmarkError(f"per_identity must be ≥ 1, got {per_identity}")
    rng = random.Random(seed)
    items = tuple(it for it in bench.items if it.stems and it.related)
    pool: dict[str, tuple[str, set[int]]] = {}
    for n, it in enumerate(items):
        for r in it.related:
            pool.setdefault(norm_identity(r), (r, set()))[1].add(n)
    couples = [
        (i, j, r1, r2)
        for i, j in combinations(range(len(items)), 2)
        if not items[i].conflicts(items[j])
        for r1 in items[i].related
        for r2 in items[j].related
        if norm_identity(r1) != norm_identity(r2)
    ]
    if not couples:
        raise BenchmarkError(
            f"{bench.source}: no two items without a shared identity; "
            "a benchmark needs items of at least two different cultures"
        )
    rng.shuffle(couples)
    correct: Counter = Counter()
    usage: Counter = Counter()
    pairs: list[Pair] = []
    for i, j, r1, r2 in couples:
        if max_pairs is not None and len(pairs) + 2 > max_pairs:
            break
        k1, k2 = norm_identity(r1), norm_identity(r2)
        if correct[k1] >= per_identity or correct[k2] >= per_identity:
            continue
        t = _distractor(pool, items, i, j, usage, rng)
        if t is None:
            continue
        correct[k1] += 1
        correct[k2] += 1
        usage[t] += 1
        for item, r, other, w in ((items[i], r1, items[j], r2), (items[j], r2, items[i], r1)):
            pairs.append(make_pair(item, rng.choice(item.stems), r, w, other.name, pool[t][0], rng.randrange(2)))
    if not pairs:
        raise BenchmarkError(
            f"{bench.source}: no pair could be built (no distractor identity left); add items of more cultures"
        )
    return pairs
