"""The neurons tune's effect: a pair's bias is the JS divergence of its two next-token distributions.
An edit that inverts a pair's bias earns nothing, one that amplifies it loses, one that removes it
earns it all; ``amplified`` counts the pairs an edit made more biased."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from surgery.find.tune.neurons import amplified
from surgery.find.tune.neurons_eval import js_divergence


def _logprobs(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32).log_softmax(-1)


def test_an_inverted_bias_earns_nothing_and_an_amplified_one_loses():
    group_a, group_b = _logprobs([2.0, 0.0, 0.0]), _logprobs([0.0, 2.0, 0.0])
    base = js_divergence(group_a, group_b)
    inverted = js_divergence(group_b, group_a)  # the other group now favoured as strongly
    removed = js_divergence(group_a, group_a)
    stronger = js_divergence(_logprobs([4.0, 0.0, 0.0]), _logprobs([0.0, 4.0, 0.0]))
    assert base[0] > 0 and inverted == pytest.approx(base)  # effect base − inverted = 0
    assert removed == pytest.approx([0.0], abs=1e-7)  # effect = the whole bias
    assert stronger[0] > base[0]  # effect < 0: off the front
    assert base[0] <= np.log(2)


def test_amplified_is_the_share_of_pairs_made_more_biased():
    base = np.array([0.1, 0.2, 0.3, 0.4])
    edited = np.array([0.05, 0.25, 0.3, 0.1])
    assert amplified(base, edited) == 0.25
