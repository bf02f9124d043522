"""The front and the choice from it: non-dominated points, the knee, the KL bound and its one-line error."""

from __future__ import annotations

import pytest

from surgery.core.errors import ParameterError
from surgery.find.tune.front import Point, choose, dominates, knee, pareto_front

POINTS = [
    Point(0, 1.0, 0.10),
    Point(1, 2.0, 0.20),
    Point(2, 1.5, 0.30),  # dominated by 1
    Point(3, 3.0, 0.90),
    Point(4, 0.5, 0.01),
    Point(5, 2.0, 0.20),  # equal to 1: the first trial stays
    Point(6, float("nan"), 0.0),  # a failed measurement never enters
    Point(7, 0.0, 0.001),  # no effect: matched by the unedited model (0 at KL 0)
    Point(8, -0.5, 0.0001),  # worse than no edit
]


def test_the_front_is_the_non_dominated_points_by_kl():
    assert [p.number for p in pareto_front(POINTS)] == [4, 0, 1, 3]
    assert dominates(POINTS[1], POINTS[2]) and not dominates(POINTS[1], POINTS[5])


def test_the_bound_chooses_the_largest_effect_within_it():
    front = pareto_front(POINTS)
    assert choose(front, 0.25) == (POINTS[1], "max_kl")
    assert choose(front, 1.0) == (POINTS[3], "max_kl")


def test_without_a_bound_the_knee_is_nearest_the_ideal_corner():
    # scaled to the front's range: trial 1 is (1/2.5 below the best effect, 0.19/0.89 above the least KL)
    front = pareto_front(POINTS)
    assert knee(front) == POINTS[1] and choose(front, None) == (POINTS[1], "knee")


def test_a_bound_no_point_meets_names_the_smallest_kl_reached():
    with pytest.raises(ParameterError) as err:
        choose(pareto_front(POINTS), 0.001)
    assert str(err.value) == (
        "no trial with an effect kept first-token KL within max_kl 0.001: the smallest KL reached was 0.01 (trial 4); "
        "raise max_kl or widen the search"
    )


def test_an_edit_that_does_no_better_than_none_never_enters_the_front():
    """On SmolLM2 a 2-point front (effect 0 at KL 0.03, effect 0.5 at KL 0.09) had its knee at the edit that
    removed nothing: the unedited model (0 at KL 0) beats it, so it is no front point."""
    front = pareto_front([Point(1, 0.0, 0.0301), Point(3, 0.5, 0.088)])
    assert [p.number for p in front] == [3] and choose(front, None) == (Point(3, 0.5, 0.088), "knee")
    assert choose(pareto_front(POINTS), 0.05) == (POINTS[4], "max_kl")  # trials 7 and 8 are cheaper, not chosen


def test_no_trial_with_an_effect_is_one_line_naming_the_largest():
    points = [Point(0, 0.0, 0.03), Point(1, -0.25, 0.01)]
    with pytest.raises(ParameterError) as err:
        choose(pareto_front(points), None, points)
    assert str(err.value) == (
        "no trial had an effect above 0, the unedited model's (the largest: +0, trial 0): every edit tried did "
        "no better than none; run more trials or widen the search"
    )
