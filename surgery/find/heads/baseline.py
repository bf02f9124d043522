"""The random-head baseline as a sequential Monte-Carlo test (Besag & Clifford 1991).

The selection's knockout is compared with random head sets of its size; the empirical p-value is
the chance that a random set removes at least as much of ΔS. Run to a cap of R sets, with k of them
at least as effective, it is (k + 1) / (R + 1). Besag & Clifford's sequential form stops as soon as
h sets were at least as effective, after l sets, with p = h / l: a valid p-value that spends few
sets on heads no better than random. h is the least exceedance count at which p ≤ level is out of
reach at the cap: h = ⌊level·(R + 1)⌋, at least 1.

The smallest p the cap allows is 1 / (R + 1): with R = 10 that is 0.091, so p ≤ 0.05 cannot be
reached at all (``reachable`` False, and find-heads says so); R ≥ 19 can.

Where the runner keeps every batch's baseline pass (causal.PairRunner.holds_all) a sweep costs no
baseline pass, so the sets run one at a time and none after the stop. Otherwise they run in at most
two sweeps (one baseline pass over the prompts each): the first ``first_chunk`` sets with the
selection's own knockouts, the rest only when still undecided.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core.counted import counted


@dataclass(frozen=True)
class Sequential:
    """The stopping rule of ``cap`` random sets at ``level`` (None: every set, no stopping)."""

    cap: int
    level: float | None = None

    @property
    def reachable(self) -> bool:
        """Whether p ≤ level is possible at all with ``cap`` sets: 1 / (cap + 1) ≤ level."""
        return self.level is None or self.level * (self.cap + 1) >= 1 - 1e-9

    @property
    def stop_after(self) -> int:
        """h: stop after this many sets at least as effective as the selection."""
        if self.level is None:
            return self.cap + 1  # never
        return max(1, math.floor(self.level * (self.cap + 1) + 1e-9))

    def first_chunk(self) -> int:
        """Sets swept together with the selection's knockouts: a quarter of the cap, at least h."""
        if self.level is None:
            return self.cap
        return min(self.cap, max(self.stop_after, math.ceil(self.cap / 4)))

    def stopped_at(self, effects: Sequence[float], tested: float) -> int | None:
        """l: the number of sets after which the h-th exceedance came (None: not yet)."""
        seen = 0
        for i, e in enumerate(effects, 1):
            # a NaN selection effect (ΔS_base = 0) is beaten by every set: nothing to test
            seen += not math.isfinite(tested) or (math.isfinite(e) and e >= tested)
            if seen >= self.stop_after:
                return i
        return None

    def summary(self, effects: Sequence[float], tested: float) -> dict[str, Any]:
        """The random-set summary of the sets run (``effects``, in order, at most ``cap``): mean, sd,
        95th percentile, share at least as effective, the p-value and why the sets stopped."""
        at = self.stopped_at(effects, tested)
        used = np.array(list(effects)[: at or self.cap], float)
        finite = used[np.isfinite(used)]
        k = int(np.sum(finite >= tested)) if math.isfinite(tested) else len(used)
        if at is not None:
            p, why = self.stop_after / at, f"{counted(self.stop_after, 'set')} at least as effective"
        else:
            p, why = (k + 1) / (len(used) + 1), "all sets" if self.level is None else "cap"
        return {
            "n": len(used),
            "mean_pct": float(np.mean(finite)) if len(finite) else float("nan"),
            "sd_pct": float(np.std(finite)) if len(finite) else float("nan"),
            "p95_pct": float(np.percentile(finite, 95)) if len(finite) else float("nan"),
            # share of random sets at least as effective
            "share_ge_tested": float(np.mean(finite >= tested)) if len(finite) else float("nan"),
            "p": float(p),
            "cap": self.cap,
            "level": self.level,
            "stop_after": None if self.level is None else self.stop_after,
            "stopped": why,
            "reachable": self.reachable,
        }


def unreachable_note(cap: int, level: float) -> str:
    """What a run whose cap cannot reach ``level`` says (see the module docstring)."""
    need = math.ceil(1 / level - 1 - 1e-9)
    return (
        f"with --random-sets {cap} the random-set baseline's smallest p is 1/{cap + 1} = {1 / (cap + 1):.3f} > "
        f"level {level:g}: it cannot show the heads beat random heads at that level; use --random-sets {need} or more"
    )
