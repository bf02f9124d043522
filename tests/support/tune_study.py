"""A study on a cheap two-objective function of the heads' space: what the study tests share (its
draws, its objectives, and running it trial by trial)."""

from __future__ import annotations

KEY = {"method": "heads", "model": "m"}


def draw(trial):
    return {"alpha": trial.suggest_float("alpha", 1.0, 4.0), "top": trial.suggest_int("top", 1, 3)}


def measure(point):
    """A cheap two-objective function of the heads' space."""
    alpha, top = point["alpha"], point["top"]
    return alpha - 0.5 * top, (alpha - 1.0) ** 2 * top, {}


def drawn(study) -> list[tuple[dict, list[float]]]:
    return [(dict(t.params), list(t.values)) for t in study.finished()]


def run(study, upto: int) -> None:
    while len(study.finished()) < upto:
        study.run_one(draw, measure)
