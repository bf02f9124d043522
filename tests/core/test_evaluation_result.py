"""The eval result file's readings (surgery/core/evaluation_result.py)."""

from __future__ import annotations

import pytest

from surgery.core.evaluation_result import retained


def test_retained_percent_direction():
    assert retained("mcq_accuracy", 0.5, 0.45) == pytest.approx(90.0)
    assert retained("perplexity", 10.0, 12.5) == pytest.approx(80.0)  # higher perplexity = less retained
    assert retained("bbq_bias_ambig", 0.1, 0.05) is None
