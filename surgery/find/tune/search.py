"""The search loop every tune method shares: trials drawn and measured until the budget is spent,
one progress line each with the best point so far, then the front and the chosen point.

Under torchrun rank 0 alone holds the study: it draws each trial and hands the point to every rank
(as JSON), every rank measures its share of the prompts (the method's measure gathers the rows), and
rank 0 records the objectives. At the end rank 0 hands the finished trials to every rank, so that
all of them choose the same point and confirm it together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...core import distributed
from .front import Point, choose, pareto_front
from .params import TuneParams
from .record import Chosen, Trial
from .study import Draw, Measure, MeasureMany, Study, study_key


@dataclass(frozen=True)
class Done:
    """A finished trial as every rank knows it (the fields of Optuna's FrozenTrial the record reads)."""

    number: int
    params: dict[str, Any]
    values: tuple[float, float]
    user_attrs: dict[str, Any]

    @classmethod
    def of(cls, frozen: Any) -> Done:
        return cls(frozen.number, dict(frozen.params), tuple(frozen.values), dict(frozen.user_attrs))

    def to_json(self) -> list[Any]:
        return [self.number, self.params, list(self.values), self.user_attrs]


def run_search(
    folder: Path,
    key: dict[str, Any],
    draw: Draw,
    measure: Measure,
    params: TuneParams,
    describe: Callable[[dict[str, Any]], str],
    report: Callable[[str], None],
    measure_many: MeasureMany | None = None,
) -> list[Done]:
    """Run (or resume) the study in ``folder`` until it holds ``params.trials`` finished trials; the
    first ``params.trials`` of them, on every rank. ``measure_many``: measures several points together
    (the trials the sampler draws at random, TPE's start-up, are then drawn at once and measured so)."""
    # every rank must measure what rank 0's study is keyed by: the same model, prompts and options
    distributed.check_agree("the model, the prompts and the tune's options", study_key(key))
    if not distributed.is_main():
        while (message := distributed.broadcast_json())["point"] is not None:
            if measure_many is not None and "points" in message:
                measure_many(message["points"])
            else:
                measure(message["point"])
        if "error" in message:
            raise distributed.StoppedByRank0(f"rank 0 stopped the tune: {message['error']}")
        return [Done(n, p, tuple(v), a) for n, p, v, a in message["finished"]]
    measuring = [False]  # whether the other ranks are inside a trial's collectives
    try:
        study = Study(folder, key, params.sampler, params.seed, params.population, params.trials_at_once)
        try:
            finished = _search(study, draw, measure, params, describe, report, measuring, measure_many)
        finally:
            study.close()  # finished or failed: the trials folded into study.db, no log left beside it
    except BaseException as exc:
        # Between trials the other ranks wait for the next point: tell them to stop. Inside a trial
        # they wait in its collectives, and torchrun stops them when this process exits.
        if distributed.under_torchrun() and not measuring[0]:
            distributed.broadcast_json({"point": None, "error": str(exc) or type(exc).__name__})
        raise
    distributed.broadcast_json({"point": None, "finished": [d.to_json() for d in finished]})
    return finished


def _search(
    study: Study,
    draw: Draw,
    measure: Measure,
    params: TuneParams,
    describe: Callable[[dict[str, Any]], str],
    report: Callable[[str], None],
    measuring: list[bool],
    measure_many: MeasureMany | None = None,
) -> list[Done]:
    done = len(study.finished())
    if done:
        report(f"resuming the study in {study.path.parent}: {min(done, params.trials)} of {params.trials} trials done")
    else:  # said now, not at the end: a run stopped midway (Ctrl-C) is resumed from this folder
        report(f"a new study in {study.path.parent}: stopped midway, the same command resumes it")
    best: Point | None = None
    for frozen in study.finished()[: params.trials]:
        best = better(best, Point(frozen.number, *frozen.values), params.max_kl)

    def shared(trial: Any) -> dict[str, Any]:
        point = draw(trial)
        distributed.broadcast_json({"point": point})  # every rank measures the same point
        measuring[0] = True
        return point

    def shared_many(points: list[dict[str, Any]]) -> list[tuple[float, float, dict[str, Any]]]:
        distributed.broadcast_json({"point": points[0], "points": points})  # every rank measures them all
        measuring[0] = True
        return measure_many(points)

    while len(study.finished()) < params.trials:
        count = study.together(params.trials - len(study.finished())) if measure_many is not None else 1
        if count > 1:
            batch = study.run_many(count, draw, shared_many)
        else:
            batch = [study.run_one(shared, measure)]
        measuring[0] = False
        before = len(study.finished()) - len(batch)
        for i, frozen in enumerate(batch):
            point = Point(frozen.number, *frozen.values)
            best = better(best, point, params.max_kl)
            report(trial_line(before + i + 1, params.trials, describe(frozen.params), point, best))
    return [Done.of(t) for t in study.finished()[: params.trials]]


def trial_record(done: Done, **fields: Any) -> Trial:
    """A finished trial as the record's :class:`Trial`: its parameters, objectives and seconds, and
    the method's own ``fields``."""
    return Trial(
        number=done.number,
        params=dict(done.params),
        effect=float(done.values[0]),
        kl=float(done.values[1]),
        seconds=done.user_attrs.get("seconds"),
        **fields,
    )


def front_and_choice(trials: Sequence[Trial], max_kl: float | None) -> tuple[list[int], Chosen, Trial]:
    """The numbers of the front of ``trials``, the choice made from it (with the rule that made it) and
    the chosen trial."""
    points = [Point(t.number, t.effect, t.kl) for t in trials]
    front = pareto_front(points)
    point, rule = choose(front, max_kl, points)
    chosen = next(t for t in trials if t.number == point.number)
    return [p.number for p in front], Chosen(number=point.number, rule=rule, max_kl=max_kl), chosen


def better(best: Point | None, point: Point, max_kl: float | None) -> Point | None:
    """The best point so far: the largest effect above 0 (within ``max_kl`` when given)."""
    if point.effect <= 0 or (max_kl is not None and point.kl > max_kl):
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
