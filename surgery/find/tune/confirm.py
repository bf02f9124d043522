"""The held-out confirmation: the chosen point measured on the test split, with 95% bootstrap CIs.

The effect's interval resamples items (all pairs of an item together, as find-heads' knockout CIs
do), the KL's resamples neutral prompts. The test split was never seen by the search, so the
interval says what the chosen point does on prompts it was not chosen on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

N_BOOT = 1000


def bootstrap_ci(
    groups: Sequence[np.ndarray], statistic: Callable[[np.ndarray], float], seed: int, n_boot: int = N_BOOT
) -> list[float]:
    """95% percentile interval of ``statistic(rows)`` over ``n_boot`` resamples of whole groups of rows."""
    rng = np.random.default_rng(seed)
    values = [
        statistic(np.concatenate([groups[g] for g in rng.integers(0, len(groups), len(groups))])) for _ in range(n_boot)
    ]
    lo, hi = np.percentile(values, [2.5, 97.5])
    return [float(lo), float(hi)]


def item_groups(items: Sequence[str]) -> list[np.ndarray]:
    """The pair indices of each item, items in sorted order."""
    names = sorted(set(items))
    return [np.array([i for i, it in enumerate(items) if it == name]) for name in names]


def gain_ci(
    base: np.ndarray, edited: np.ndarray, items: Sequence[str], sign: float, seed: int
) -> tuple[float, list[float]]:
    """ΔS gain ``sign · (ΔS_edited − ΔS_base)`` over the pairs (S: match rows, then mismatch rows)
    and its 95% CI, resampling items."""
    n = len(items)
    d_base, d_edit = base[:n] - base[n:], edited[:n] - edited[n:]

    def gain(idx: np.ndarray) -> float:
        return float(sign * (d_edit[idx].mean() - d_base[idx].mean()))

    return gain(np.arange(n)), bootstrap_ci(item_groups(items), gain, seed)


def mean_ci(values: np.ndarray, seed: int) -> tuple[float, list[float]]:
    """The mean of ``values`` and its 95% CI, resampling them one by one."""
    groups = [np.array([i]) for i in range(len(values))]
    return float(values.mean()), bootstrap_ci(groups, lambda idx: float(values[idx].mean()), seed)
