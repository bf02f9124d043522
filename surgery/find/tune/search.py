"""The search loop every tune method shares: trials drawn and measured until the budget is spent,
one progress line each with the best point so far, then the front and the chosen point."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .front import Point, choose, pareto_front
from .params import TuneParams
from .record import Chosen, Trial
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


def trial_record(frozen: Any, **fields: Any) -> Trial:
    """A finished Optuna trial as the record's :class:`Trial`: its parameters, objectives and seconds,
    and the method's own ``fields``."""
    return Trial(
        number=frozen.number,
        params=dict(frozen.params),
        effect=float(frozen.values[0]),
        kl=float(frozen.values[1]),
        seconds=frozen.user_attrs.get("seconds"),
        **fields,
    )


def front_and_choice(trials: Sequence[Trial], max_kl: float | None) -> tuple[list[int], Chosen, Trial]:
    """The numbers of the front of ``trials``, the choice made from it (with the rule that made it) and
    the chosen trial."""
    front = pareto_front([Point(t.number, t.effect, t.kl) for t in trials])
    point, rule = choose(front, max_kl)
    chosen = next(t for t in trials if t.number == point.number)
    return [p.number for p in front], Chosen(number=point.number, rule=rule, max_kl=max_kl), chosen


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
