"""The work a find-heads run does, said before it starts: its prompt passes (and the CPU time they
take, scaled from a measured run), its forward-FLOP bound against the exhaustive procedure as full
passes, and the screen's note on its agreement with the exact knockouts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...core.counted import counted
from ...core.mcq import Encoded
from .baseline import Sequential
from .flops import Counter
from .params import FindParams

# Above this many pairs find-heads is a long job on a CPU (the quickstart uses 96).
LARGE_RUN_PAIRS = 200
# The quickstart's find-heads (SmolLM2-135M, --max-pairs 96 --random-sets 10) measured on 2 CPU cores:
# 6.3 and 12.4 min wall, 2026-12-01 and 2026-12-02 by machine (docs/quickstart.md), with the
# default (exhaustive) procedure. The CPU hint of a large run scales these by its prompt passes.
CPU_REFERENCE = FindParams(random_sets=10, exhaustive=True)
CPU_REFERENCE_MINUTES = (6.3, 12.4)


def dose_alphas(params: FindParams) -> tuple[float, ...]:
    """The α values of the dose-response: the grid and the awareness runs' α (the bake's among them)."""
    return tuple(sorted(set(params.dose_grid) | set(params.awareness_alphas)))


def dose_passes(params: FindParams) -> int:
    """Passes over the pairs the dose-response needs: α = 1 reuses the baseline, every other α runs
    edge-level and whole-head once each."""
    return 2 * sum(a != 1.0 for a in dose_alphas(params)) if params.dose_response else 0


def confirmations(params: FindParams) -> int:
    """Single-head knockouts at most: discovery's top ``confirm`` (the screened procedure knocks out
    the screen's top ``--candidates`` of them, and more only where its error leaves them a chance)."""
    return params.confirm


def knockout_passes(params: FindParams) -> int:
    """Knockout passes over the pairs: confirmations, selection, control, random sets (all of them; the
    screened procedure's may stop early), dose-response. The screened procedure's guess of the
    selection, run with the confirmations, counts as the selection's (2 + a few random sets more
    where the guess is wrong)."""
    return confirmations(params) + 2 + params.random_sets + dose_passes(params)


def prompt_passes(n_pairs: int, params: FindParams) -> int:
    """Prompt passes of a run: 4 per pair to score (2 more for the screen's backward, about a
    forward's work), 2 per pair in each knockout pass."""
    screen = 2 * n_pairs if params.screened else 0
    return 4 * n_pairs + screen + knockout_passes(params) * 2 * n_pairs


def _durations(lo: float, hi: float) -> str:
    """Two durations in minutes as one range: ``"20–39 min"``, ``"2.8–5.6 h"``."""
    return f"{lo:.0f}–{hi:.0f} min" if hi < 90 else f"{lo / 60:.1f}–{hi / 60:.1f} h"


def work_note(n_pairs: int, params: FindParams) -> str:
    """How many prompt passes find-heads will run: said before an hour-long CPU job starts,
    with the CPU time it takes scaled from the quickstart's measured run (CPU_REFERENCE_MINUTES)."""
    total = prompt_passes(n_pairs, params)
    hint = ""
    if n_pairs > LARGE_RUN_PAIRS:
        lo, hi = (m * total / prompt_passes(96, CPU_REFERENCE) for m in CPU_REFERENCE_MINUTES)
        hint = (
            f"; on 2 CPU cores a 135M model needs about {_durations(lo, hi)} for that (the quickstart's "
            f"--max-pairs 96 --random-sets 10 took {CPU_REFERENCE_MINUTES[0]}–"
            f"{CPU_REFERENCE_MINUTES[1]} min): use those on a CPU, or a GPU"
        )
    screen = " at most, the screen's backward counted as one" if params.screened else ""
    return f"{counted(n_pairs, 'pair')}: about {total:,} prompt passes ({knockout_passes(params)} knockout passes{screen}){hint}"


def flops_note(
    counter: Counter, binding: Sequence[Encoded], scoring: int, scoring_full: int, params: FindParams
) -> str:
    """FLOPs before the start: the exhaustive procedure's full passes (``scoring_full`` for the
    scoring), and this run's bound (``scoring``, with the screen's backward; every knockout resumed
    at its first query token from layer 0, every random set run; the real heads sit higher and the
    random sets may stop early, see findings["cost"])."""
    b = params.batch_size
    full, tested = counter.full(binding, b), counter.resumed_bound(binding, b, "tested")
    edge_alphas = sum(a != 1.0 for a in dose_alphas(params)) if params.dose_response else 0
    rule = Sequential(params.random_sets, params.level if params.screened else None)
    # the baseline passes of the confirmation's sweep and the knockouts' one or two (the dose-response
    # shares the first), where the scoring pass's kept ones do not serve (--keep-memory)
    sweeps = (params.confirm > 0) + 1 + (rule.first_chunk() < params.random_sets)
    bound = (
        scoring
        + sweeps * full
        + edge_alphas * full  # whole-head α passes (from layer 0)
        + (confirmations(params) + 1 + params.random_sets + edge_alphas) * tested
        + counter.resumed_bound(binding, b, "control")
    )
    today = scoring_full + (params.confirm + 2 + params.random_sets + 2 * edge_alphas) * full
    return (
        f"FLOPs: at most {bound:.3e} (knockouts resumed at their heads' layer and first query token; "
        f"the exhaustive procedure as full passes: {today:.3e}, ×{bound / today:.2f})"
    )


def screen_note(confirmed: Mapping[str, Any], pool: int, beyond: Sequence[Mapping[str, Any]]) -> str:
    """The screen's agreement with the exact single-head knockouts, as find-heads reports it, and the
    heads outside the pool it suggests (a note: the selection comes from the pool)."""
    note = (
        f"attribution-patching screen: {confirmed['candidates']} of discovery's top {pool} heads knocked out "
        f"alone; Spearman {confirmed['spearman']:.2f} between their screened and exact effects"
    )
    if beyond:
        heads = ", ".join(f"{h['layer']}.{h['head']} ({h['effect_pct']:.1f} %)" for h in beyond[:5])
        note += (
            f"; outside discovery's top {pool} the screen suggests {heads}"
            + (f" and {len(beyond) - 5} more" if len(beyond) > 5 else "")
            + ": more than the selection's weakest exact effect (not tested)"
        )
    return note
