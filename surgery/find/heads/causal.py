"""Causal tests of chosen heads: edge knockout with controls and random baselines, dose-response of
edge-level α (the paper's, run time only) and of whole-head α (o_proj slice, what a bake holds).

Knockout effect = (1 − ΔS_knockout / ΔS_base) · 100, i.e. the % reduction of |ΔS| when the
tested identity's (R in match, W in mismatch) query tokens cannot attend to the item tokens in
the chosen heads. Control: the same edges from the distractor T's tokens. Baseline: random head
sets of the same size. CIs: percentile bootstrap over items (pairs resampled item by item), given
only where ΔS_base keeps its sign across the resamples (see :func:`bootstrap_effect`).

Confirmation (the paper's "final choice confirmed by knockout", docs/methods/binding-heads.md): each
discovery candidate's edges are knocked out alone; candidates whose reduction is significant (95% CI
above 0) come first, by effect. Discovery alone can rank *readers* first — later heads whose
identity→item attention differs between match and mismatch because the binding is already in the
residual stream — and knocking their edges out changes nothing.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...core import distributed
from ...core.edits import HeadScale
from ...core.mcq import Encoded
from ...core.sizes import human_size
from ...model.placement import input_device
from .attention import EdgeEdit, edge_heads
from .baseline import Sequential
from .flops import Counter
from .params import DOSE_GRID, KEEP_MEMORY, keep_bytes
from .prompts import batch_groups, collate
from .resume import Snapshot, resume, resume_scaled, snapshot
from .scores import SPAN_NAMES, delta, pad_id, run_prompts, s_scores

Heads = Sequence[tuple[int, int]]
# Baseline passes kept between sweeps by default (--keep-memory), up to this many bytes of recorded
# layer inputs and keys/values (24 SmolLM2 pairs: 0.79 GB): a later sweep reads them instead of running
# its baseline pass again (the same recorded inputs: the same S bit for bit); batches beyond it run theirs again.
KEEP_BYTES = keep_bytes(KEEP_MEMORY)
# What one sweep condition edits: identity→item edges (run time only), or whole heads (o_proj slices).
Condition = EdgeEdit | tuple[HeadScale, ...]


def effect(base: float, knocked: float) -> float:
    """% reduction of ΔS: (1 − ΔS_ko / ΔS_base) · 100 (NaN when ΔS_base is 0)."""
    return (1.0 - knocked / base) * 100.0 if base else float("nan")


def _by_item(items: Sequence[str]) -> list[np.ndarray]:
    names = sorted(set(items))
    return [np.array([i for i, it in enumerate(items) if it == n]) for n in names]


# The share of resamples in which ΔS_base must keep its sign for the effect % to get a CI: the
# percentile interval's own coverage (its bounds are the 2.5th and 97.5th percentiles).
SIGN_KEPT = 0.975


def bootstrap_effect(
    base_m: np.ndarray,
    base_mm: np.ndarray,
    ko_m: np.ndarray,
    ko_mm: np.ndarray,
    items: Sequence[str],
    n_boot: int = 1000,
    seed: int = 0,
    estimate: float | None = None,
) -> tuple[float, float]:
    """95% percentile CI of the knockout effect ``estimate`` (default: computed from the arrays),
    resampling items with replacement; NaN bounds where the data give it no interval.

    The effect is a ratio, (1 − ΔS_ko / ΔS_base) · 100. When ΔS_base does not keep its sign across
    the resamples, their ratios mix effects of opposite meaning (a reduction of a negative ΔS and
    one of a positive ΔS), and near ΔS_base = 0 the estimate itself lies far out while most
    resamples, with a larger |ΔS_base|, do not: the interval would not even hold the estimate
    (find-heads once printed −12.2 % with [−5.6, 4.9]). So there is a CI only when ΔS_base keeps
    its sign in ``SIGN_KEPT`` of the resamples, and only when it holds the estimate: a percentile
    interval that leaves out its own estimate does not describe that estimate's uncertainty. The
    bounds are widened by at most rounding to hold it exactly (resample means add in another order).
    """
    groups = _by_item(items)
    rng = np.random.default_rng(seed)
    d_base, d_ko = base_m - base_mm, ko_m - ko_mm
    if estimate is None:
        estimate = effect(d_base.mean(), d_ko.mean())
    bases, values = [], []
    for _ in range(n_boot):
        idx = np.concatenate([groups[g] for g in rng.integers(0, len(groups), len(groups))])
        bases.append(d_base[idx].mean())
        values.append(effect(bases[-1], d_ko[idx].mean()))
    values = np.array(values)
    kept = np.mean(np.sign(bases) == np.sign(d_base.mean()))
    values = values[np.isfinite(values)]
    if not math.isfinite(estimate) or kept < SIGN_KEPT or not len(values):
        return float("nan"), float("nan")
    lo, hi = (float(v) for v in np.percentile(values, [2.5, 97.5]))
    rounding = 1e-9 * max(1.0, abs(estimate))
    if not lo - rounding <= estimate <= hi + rounding:
        return float("nan"), float("nan")
    return min(lo, estimate), max(hi, estimate)


class PairRunner:
    """Runs the match and mismatch prompts of a pair set under edits; keeps the baseline.

    Edge edits run together (:meth:`sweep`): one baseline pass per batch, each edit resumed from its
    first layer and first query token (resume.py); ``counter`` adds up the forward-pass FLOPs. The
    baseline passes are kept (up to ``keep_bytes``; :meth:`keep` takes those of the scoring pass), so
    that a later sweep runs none of its own; ``report`` hears once that a batch did not fit.
    Swept S are kept by condition, so that conditions known early can share one sweep (find_heads:
    the knockouts and the dose-response) and later calls read them back. Without a given ``base``
    the baseline S are those of the first sweep's baseline passes (a full pass of its own only when
    asked for before any sweep).
    """

    def __init__(
        self,
        model,
        prompts: Sequence[Encoded],
        items: Sequence[str],
        option_ids,
        batch_size: int = 8,
        base: np.ndarray | None = None,
        progress: Callable[[int], None] | None = None,
        keep_bytes: int = KEEP_BYTES,
        report: Callable[[str], None] | None = None,
    ):
        self.model, self.prompts, self.items = model, prompts, list(items)
        self.ids, self.batch_size, self.progress = option_ids, batch_size, progress
        self.n = len(self.items)
        self.counter = Counter.of(model)
        self.full_flops = 0  # what the same passes cost from the embeddings, one edit at a time
        self.swept: dict[tuple, np.ndarray] = {}  # condition_key → S of every prompt
        self._base = base
        self.kept: dict[tuple[int, ...], Snapshot] = {}  # batch rows → its baseline pass
        self.keep_bytes, self.kept_bytes = keep_bytes, 0
        self.report, self.over = report, False  # over: a batch's pass did not fit (said once)

    def holds_all(self) -> bool:
        """Whether every batch's baseline pass is kept (a sweep then runs none); under torchrun, every
        rank's of its own batches (the same answer on every rank: they sweep alike)."""
        mine = distributed.Shard(batch_groups(self.prompts, self.batch_size), len(self.prompts))
        return distributed.all_true(all(tuple(idx) in self.kept for idx in mine))

    def keep(self, rows: Sequence[int], snap: Snapshot) -> bool:
        """Keep ``snap``, the baseline pass of the batch of ``rows`` (batch_groups' order), while the
        kept passes stay within ``keep_bytes``; False where it would not fit."""
        size = snap.nbytes()
        if self.kept_bytes + size > self.keep_bytes:
            if not self.over and self.report is not None:  # said when it happens: the sweeps to come are slower
                self.report(
                    f"the baseline passes take more than the {human_size(self.keep_bytes)} they may keep "
                    "(--keep-memory): the batches past it run theirs again in each sweep (slower, the same findings)"
                )
            self.over = True
            return False
        self.kept[tuple(rows)], self.kept_bytes = snap, self.kept_bytes + size
        return True

    @property
    def base(self) -> np.ndarray:
        """S of every prompt without an edit."""
        if self._base is None:
            self._base = self.scores(None)
        return self._base

    @base.setter
    def base(self, s: np.ndarray) -> None:
        self._base = s

    def scores(self, edit: EdgeEdit | None) -> np.ndarray:
        """S of every prompt under ``edit`` (full passes; with an edge edit: :meth:`sweep`)."""
        if edit is not None:
            return self.sweep([edit])[0]
        full = self.counter.full(self.prompts, self.batch_size)
        self.counter.flops += full
        self.full_flops += full
        # the layout of the sweeps' baseline passes: a row no edit changes keeps this S exactly
        return run_prompts(
            self.model, self.prompts, self.ids, batch_size=self.batch_size, share_prefixes=False, progress=self.progress
        ).s

    def sweep(self, edits: Sequence[Condition]) -> list[np.ndarray]:
        """S of every prompt under each of ``edits`` (edge edits or whole-head scales), sharing each
        batch's unchanged work: one baseline pass per batch, every condition resumed from it.

        Conditions swept before (:meth:`prefetch`) are read back, not run again; ``full_flops`` counts
        every condition asked for, as the one-edit-at-a-time full passes would run it.
        """
        self.prefetch(edits)
        self.full_flops += len(edits) * self.counter.full(self.prompts, self.batch_size)
        return [self.swept[condition_key(e)] for e in edits]

    def prefetch(self, edits: Sequence[Condition]) -> None:
        """Sweep those of ``edits`` not swept yet (each once) and keep their S for :meth:`sweep`.

        Under torchrun each rank sweeps whole batches of its own; rows and FLOPs are gathered back.
        """
        todo = list({condition_key(e): e for e in edits if condition_key(e) not in self.swept}.values())
        if todo:
            for e, s in zip(todo, self._sweep(todo)):
                self.swept[condition_key(e)] = s

    def _sweep(self, edits: Sequence[Condition]) -> list[np.ndarray]:
        device, pad, n = input_device(self.model), pad_id(self.model), len(self.prompts)
        # without a given baseline, the last row holds the baseline passes' own S (read only then)
        keep_base = self._base is None
        out = [np.zeros(n) for _ in range(len(edits) + keep_base)]
        work = distributed.Shard(batch_groups(self.prompts, self.batch_size), n)
        flops = self.counter.flops
        for idx in work:
            batch = collate([self.prompts[i] for i in idx], idx, pad, SPAN_NAMES, device)
            snap = self.kept.get(tuple(idx))
            if snap is None:
                snap = snapshot(self.model, batch)
                self.counter.add(len(idx), snap.length)
                self.counter.add_head(len(idx))
                self.keep(idx, snap)
            if keep_base:
                out[-1][idx] = s_scores(snap.logits.float().log_softmax(-1), self.ids).cpu().numpy()
            for s, edit in zip(out, edits):
                logits = (
                    resume(self.model, snap, batch, edit, self.counter)
                    if isinstance(edit, EdgeEdit)
                    else resume_scaled(self.model, snap, edit, self.counter)
                )
                s[idx] = s_scores(logits.float().log_softmax(-1), self.ids).cpu().numpy()
                if self.progress:
                    self.progress(len(idx))
            work.done(idx)
        out = work.gather(*out)
        (spent,) = work.sum(self.counter.flops - flops)
        self.counter.flops = flops + int(spent)
        work.finish(self.progress, per_item=len(edits))
        if keep_base:
            self._base = out.pop()
        return out

    def delta(self, s: np.ndarray) -> dict[str, Any]:
        return delta(s[: self.n], s[self.n :], self.items)

    def knockout(self, heads: Heads, queries: str = "tested", seed: int = 0) -> dict[str, Any]:
        """ΔS with the (queries → item) edges of ``heads`` removed, its effect and bootstrap CI."""
        return self.knockouts([(heads, queries)], seed)[0]

    def knockouts(self, sets: Sequence[tuple[Heads, str]], seed: int = 0) -> list[dict[str, Any]]:
        """:meth:`knockout` of each (heads, queries) in ``sets``, in one sweep over the prompts."""
        edits = [knockout_edit(heads, queries) for heads, queries in sets]
        swept = self.sweep(edits)
        return [
            {"heads": [list(h) for h in heads], "edges_from": queries, **knockout_row(self.base, s, self.items, seed)}
            for (heads, queries), s in zip(sets, swept)
        ]


def knockout_row(base: np.ndarray, knocked: np.ndarray, items: Sequence[str], seed: int = 0) -> dict[str, Any]:
    """ΔS without and with a knockout (``base``, ``knocked``: S of the match prompts, then of the
    mismatch prompts, pair by pair), the effect % and its 95% CI (:func:`bootstrap_effect`), all of
    them from the same pairs and the same definition of ΔS."""
    n = len(items)
    base_d, ko_d = delta(base[:n], base[n:], items)["delta"], delta(knocked[:n], knocked[n:], items)["delta"]
    pct = effect(base_d, ko_d)
    lo, hi = bootstrap_effect(base[:n], base[n:], knocked[:n], knocked[n:], items, seed=seed, estimate=pct)
    return {"delta_base": base_d, "delta_knockout": ko_d, "effect_pct": pct, "ci95": [lo, hi]}


def condition_key(condition: Condition) -> tuple:
    """A hashable key of a sweep condition: equal keys, equal S."""
    if isinstance(condition, EdgeEdit):
        heads = tuple(sorted((layer, tuple(sorted(h))) for layer, h in condition.heads.items() if h))
        return ("edge", heads, float(condition.alpha), condition.queries, condition.keys)
    return ("whole", tuple(sorted((s.layer, s.head, float(s.alpha)) for s in condition)))


def knockout_edit(heads: Heads, queries: str = "tested") -> EdgeEdit:
    """The edge knockout (α = 0) of the (``queries`` → item) edges of ``heads``."""
    return EdgeEdit(edge_heads(list(heads)), 0.0, queries=queries)


def single_knockouts(runner: PairRunner, candidates: Heads, seed: int = 0) -> list[dict[str, Any]]:
    """Each candidate's tested-identity edges knocked out alone (one pass over the pairs each)."""
    rows = []
    kos = runner.knockouts([([(layer, head)], "tested") for layer, head in candidates], seed)
    for (layer, head), ko in zip(candidates, kos):
        rows.append(
            {
                "layer": int(layer),
                "head": int(head),
                "delta_knockout": ko["delta_knockout"],
                "effect_pct": ko["effect_pct"],
                "ci95": ko["ci95"],
                # a reduction whose whole 95% CI lies above 0 (NaN bounds compare False)
                "significant": bool(ko["ci95"][0] > 0),
            }
        )
    return rows


def confirmed_order(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Significant reductions first, each group by effect (largest first; NaN effects last); equal
    effects (heads whose knockout changes nothing: 0) by discovery rank, so that the order does not
    depend on the order the heads were knocked out in."""

    def key(r: dict[str, Any]) -> tuple[bool, float, float]:
        e = r["effect_pct"]
        return (not r["significant"], -e if math.isfinite(e) else math.inf, r.get("discovery_rank", math.inf))

    return sorted(rows, key=key)


def random_head_sets(
    layers: int | Sequence[int], n_heads: int, size: int, count: int, exclude: Heads, seed: int = 0
) -> list[list[tuple[int, int]]]:
    """``count`` random sets of ``size`` heads of ``layers`` (a count: layers 0…n−1; a hybrid model
    passes its attention layers), none of them in ``exclude``."""
    rng = random.Random(seed)
    pool = [
        (layer, h)
        for layer in (range(layers) if isinstance(layers, int) else layers)
        for h in range(n_heads)
        if (layer, h) not in set(map(tuple, exclude))
    ]
    return [sorted(rng.sample(pool, size)) for _ in range(count)]


def knockout_report(
    runner: PairRunner,
    heads: Heads,
    n_layers: int | Sequence[int],
    n_heads: int,
    *,
    random_sets: int = 20,
    seed: int = 0,
    level: float | None = None,
) -> dict[str, Any]:
    """Tested-identity knockout, distractor control and random-head baseline for ``heads``: every one
    of ``random_sets`` sets, or (``level``) sets until the p-value is decided (baseline.Sequential)."""
    rule = Sequential(random_sets, level)
    sets = knockout_sets(heads, n_layers, n_heads, random_sets, seed)
    # with every baseline pass kept a sweep costs no baseline pass: the sets run one at a time, none
    # after the stop; otherwise in two sweeps (baseline.Sequential.first_chunk)
    one_by_one = level is not None and runner.holds_all()
    done = 2 + (1 if one_by_one else rule.first_chunk())
    tested, control, *randoms = runner.knockouts(sets[:done], seed)
    while done < len(sets) and rule.stopped_at([r["effect_pct"] for r in randoms], tested["effect_pct"]) is None:
        step = done + 1 if one_by_one else len(sets)
        randoms += runner.knockouts(sets[done:step], seed)
        done = step
    summary = rule.summary([r["effect_pct"] for r in randoms], tested["effect_pct"])
    return {"tested": tested, "control": control, "random": summary, "random_sets": randoms[: summary["n"]]}


def knockout_sets(
    heads: Heads, n_layers: int | Sequence[int], n_heads: int, random_sets: int = 20, seed: int = 0
) -> list[tuple[Heads, str]]:
    """The (heads, queries) of :func:`knockout_report`: tested, control, then the random sets."""
    sets = random_head_sets(n_layers, n_heads, len(heads), random_sets, heads, seed)
    return [(heads, "tested"), (heads, "control")] + [(hs, "tested") for hs in sets]


def dose_conditions(heads: Heads, grid: Sequence[float] = DOSE_GRID) -> list[Condition]:
    """The edge-level α conditions of every α ≠ 1 of ``grid``, then the whole-head ones."""
    edited = [a for a in grid if a != 1.0]
    return [EdgeEdit(edge_heads(list(heads)), float(a)) for a in edited] + [
        tuple(HeadScale(layer, h, float(a)) for layer, h in heads) for a in edited
    ]


def dose_response(runner: PairRunner, heads: Heads, grid: Sequence[float] = DOSE_GRID) -> list[dict[str, Any]]:
    """ΔS at each α, edge-level (identity→item edges) and whole-head (o_proj slice), side by side:
    one sweep, both kinds resumed from each batch's baseline pass (whole-head from its lowest layer)."""
    rows = []
    edited = [a for a in grid if a != 1.0]
    swept = runner.sweep(dose_conditions(heads, grid))
    edges, wholes = dict(zip(edited, swept[: len(edited)])), dict(zip(edited, swept[len(edited) :]))
    for alpha in grid:
        edge = runner.delta(edges.get(alpha, runner.base))
        whole = runner.delta(wholes.get(alpha, runner.base))
        rows.append(
            {
                "alpha": float(alpha),
                "edge_delta_s": edge["delta"],
                "edge_p": edge["p"],
                "whole_delta_s": whole["delta"],
                "whole_p": whole["p"],
            }
        )
    return rows
