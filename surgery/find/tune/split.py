"""The tune / test split: the search sees the tune part only, the chosen point is confirmed on the rest.

Binding pairs are split by item (every pair of an item on one side, so the test items are unseen
items, not unseen wordings), neutral prompts one by one; both with the study's seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from ...core.errors import ParameterError


@dataclass(frozen=True)
class Split:
    """Indices of the tune and test parts."""

    tune: tuple[int, ...]
    test: tuple[int, ...]


def _cut(n: int, share: float) -> int:
    """How many of ``n`` go to the test part: ``share`` of them, rounded, at least one when share > 0."""
    return min(n, max(1 if share > 0 else 0, round(n * share)))


def split_groups(groups: Sequence[str], share: float, seed: int, what: str) -> Split:
    """Split rows by their group (an item): ``share`` of the groups, drawn with ``seed``, are the test part."""
    names = sorted(set(groups))
    random.Random(seed).shuffle(names)
    test = set(names[: _cut(len(names), share)])
    out = Split(
        tuple(i for i, g in enumerate(groups) if g not in test), tuple(i for i, g in enumerate(groups) if g in test)
    )
    check(out, f"{len(names)} {what}", share)
    return out


def split_rows(n: int, share: float, seed: int, what: str) -> Split:
    """Split ``n`` rows one by one: ``share`` of them, drawn with ``seed``, are the test part."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    cut = _cut(n, share)
    out = Split(tuple(sorted(order[cut:])), tuple(sorted(order[:cut])))
    check(out, f"{n} {what}", share)
    return out


def check(split: Split, what: str, share: float) -> None:
    """An empty part is a one-line error saying which and why."""
    for name, part in (("tune", split.tune), ("test", split.test)):
        if not part:
            raise ParameterError(
                f"the {name} split is empty: {what} split with {{test_share}} {share:g}; "
                "give more prompts or a {test_share} strictly between 0 and 1 that leaves some on each side",
                "test_share",
            )
