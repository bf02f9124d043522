"""significant() gives, value for value and bit for bit, what Python's own formatting gives
(``float(f"{v:.{n}g}")``): findings files written with it are the bytes they were before."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surgery.core.significant import significant


def python_rounded(x: np.ndarray, digits: int) -> np.ndarray:
    return np.array([float(f"{v:.{digits}g}") for v in x.ravel().tolist()]).reshape(x.shape)


def assert_same_bits(x: np.ndarray, digits: int) -> None:
    got, want = significant(x, digits), python_rounded(x, digits)
    assert got.shape == want.shape
    assert np.array_equal(np.isnan(got), np.isnan(want))
    # every other value bit for bit (the sign of a zero too); NaN stays NaN, whatever its payload
    diff = np.flatnonzero((got.view(np.int64) != want.view(np.int64)) & ~np.isnan(want))
    assert not diff.size, f"{diff.size} values differ, e.g. {x.ravel()[diff[0]]!r}: {got.ravel()[diff[0]]!r}"


def ties(rng: np.random.Generator, n: int, digits: int) -> np.ndarray:
    """Numbers on or next to the half-way point between two numbers of ``digits`` digits (the cases
    where a product's error could flip the rounding): d.5 · 10^e, and its neighbour doubles."""
    lead = rng.integers(10 ** (digits - 1), 10**digits, n) + 0.5
    x = lead * 10.0 ** rng.integers(-20, 12, n)
    return np.concatenate([x, np.nextafter(x, np.inf), np.nextafter(x, -np.inf), -x])


@pytest.mark.parametrize("digits", [1, 3, 6, 9, 15])
def test_same_bits_as_python_over_every_scale(digits):
    rng = np.random.default_rng(digits)
    spread = rng.standard_normal(100_000) * 10.0 ** rng.integers(-40, 40, 100_000)
    scores = np.abs(rng.standard_normal((30, 1536))) * 0.01  # a layer's scores, as findings hold them
    exact = rng.integers(10 ** (digits - 1), 10**digits, 20_000) * 10.0 ** rng.integers(-25, 25, 20_000)
    for x in (spread, scores, exact, ties(rng, 20_000, digits)):
        assert_same_bits(x, digits)


def test_edges_keep_pythons_answer():
    x = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308]
        + [1e22, 1e23, 1e-17, 1e-18, 9.999995e-5, 999999.5, 0.9999995, 1e5, 99999.95, 9.9999999999e-1]
    )
    assert_same_bits(x, 6)
    assert np.signbit(significant(np.array([-0.0]), 6)[0])


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=1, max_size=64),
    digits=st.integers(1, 15),
)
def test_any_doubles(values, digits):
    assert_same_bits(np.array(values, dtype=np.float64), digits)


def test_shape_is_kept_and_the_input_is_not_changed():
    x = np.linspace(-3, 3, 24).reshape(2, 3, 4) / 7
    before = x.copy()
    assert significant(x, 6).shape == (2, 3, 4)
    assert np.array_equal(x, before)


@pytest.mark.parametrize("digits", [0, 16])
def test_digits_out_of_range_are_refused(digits):
    with pytest.raises(ValueError, match="digits"):
        significant(np.ones(3), digits)
