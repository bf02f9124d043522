"""The search loop every tune method shares: trials drawn and measured until the budget is spent,
one progress line each with the best point so far, then the front and the chosen point."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .front import Point, choose, pareto_front
from .params import TuneParams
from .study import Study

Objective = Callable[[Any], tuple[float, float]]  # an Optuna trial → (effect, KL)


def run_search(
    study: Study,
    objective: Objective,
    params: TuneParams,
    describe: Callable[[dict[str, Any]], str],
    out: Path,
    report: Callable[[str], None],
) -> list[Any]:
    """Run the trials the study still lacks; the first ``params.trials`` finished trials (Optuna's)."""
    done = len(study.finished())
    if done:
        report(f"resuming the study in {out}: {min(done, params.trials)} of {params.trials} trials done")
    best: Point | None = None
    for frozen in study.finished()[: params.trials]:
        best = better(best, Point(frozen.number, *frozen.values), params.max_kl)
    while len(study.finished()) < params.trials:
        frozen = study.run_one(objective)
        point = Point(frozen.number, *frozen.values)
        best = better(best, point, params.max_kl)
        report(trial_line(len(study.finished()), params.trials, describe(frozen.params), point, best))
    return study.finished()[: params.trials]


def front_and_choice(points: list[Point], max_kl: float | None) -> tuple[list[Point], Point, str]:
    """The front of ``points``, the point chosen from it and the rule that chose it."""
    front = pareto_front(points)
    chosen, rule = choose(front, max_kl)
    return front, chosen, rule


def better(best: Point | None, point: Point, max_kl: float | None) -> Point | None:
    """The best point so far: the largest effect (within ``max_kl`` when given)."""
    if max_kl is not None and point.kl > max_kl:
        return best
    if best is None or (point.effect, -point.kl) > (best.effect, -best.kl):
        return point
    return best


def trial_line(done: int, total: int, drawn: str, point: Point, best: Point | None) -> str:
    """One progress line per trial (trials named by their number in the record), with the best point so far."""
    line = f"trial {point.number} ({done}/{total}): {drawn}: effect {point.effect:+.4g}, KL {point.kl:.3g}"
    if best is not None:
        line += f"; best so far: trial {best.number}, effect {best.effect:+.4g}, KL {best.kl:.3g}"
    return line
