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
        "no trial kept first-token KL within max_kl 0.001: the smallest KL reached was 0.01 (trial 4); "
        "raise max_kl or widen the search"
    )
