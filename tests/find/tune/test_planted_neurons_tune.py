"""Proof on the planted bias model (tests/fixtures/bias_model, tests/find/neurons/test_planted_neurons.py):
a group word shifts hire/reject through a few MLP neurons, whose effects brute force measured one by
one (ground_truth.json). The neurons tune searches prune-neurons' n, factor, score and selection rule
on find-neurons' findings of that model.

The criterion: the chosen point removes pair bias on held-out pairs (95% CI above 0); its neurons
hold brute force's best neuron and most of its best six; and on the held-out pairs it removes more
bias than every one of 20 seeded random neuron sets of the same size and factor.
"""

from __future__ import annotations

import random

import pytest

from surgery.core.optional import available, install_hint
from tests.support.planted_tune import BIAS, BIAS_PAIRS, bias_neutral_prompts, bias_truth

pytestmark = pytest.mark.skipif(not available("optuna"), reason=install_hint("optuna"))

TRIALS = 16
N_MAX = 20
RANDOM_SETS = 20
OPTIONS = {"method": "neurons", "pairs": str(BIAS_PAIRS), "batch_size": 64, "n_max": N_MAX, "trials": TRIALS}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    import torch

    import surgery

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("tune-neurons")
    found = surgery.find_neurons(BIAS, pairs=str(BIAS_PAIRS), out=tmp / "findings.json")
    neutral = bias_neutral_prompts(tmp / "neutral.jsonl")
    result = surgery.tune(BIAS, findings=found.path, out=tmp / "study", neutral=str(neutral), **OPTIONS)
    return result, found, neutral


def test_the_chosen_point_removes_bias_on_held_out_pairs(tuned):
    record = tuned[0].record
    c = record.confirmation
    assert len(record.trials) == TRIALS and record.front
    assert c.effect_ci95[0] > 0 and c.bias < c.bias_base, c
    assert set(record.split.test_items).isdisjoint(record.split.tune_items)


def test_the_chosen_neurons_hold_the_planted_ones(tuned):
    record = tuned[0].record
    chosen = set(record.trial(record.chosen.number).neurons)
    best = bias_truth(6)
    assert best[0] in chosen and len(chosen & set(best)) >= 4, (sorted(chosen), best)


def test_the_chosen_point_beats_random_neurons_of_the_same_size(tuned):
    """Measured on the held-out pairs with the same run-time passes the tune uses."""
    from surgery.core.edits import NeuronScale
    from surgery.core.mcq import Encoded
    from surgery.find.neurons.pairs import load_pairs
    from surgery.find.tune.neurons_eval import PairTrials
    from surgery.model.loading import load_model, load_tokenizer

    result, found, neutral = tuned
    record = result.record
    chosen = record.trial(record.chosen.number)
    test_ids = set(record.split.test_items)
    pairs = [p for p in load_pairs(str(BIAS_PAIRS)).pairs if p.id in test_ids]
    tok, model = load_tokenizer(BIAS), load_model(BIAS)

    def enc(texts):
        return [Encoded(tuple(tok(t)["input_ids"]), {}) for t in texts]

    trials = PairTrials.of(
        model, enc([p.prompt_1 for p in pairs]), enc([p.prompt_2 for p in pairs]), enc(["the applicant"]), 64
    )
    factor, n = float(chosen.params["factor"]), len(chosen.neurons)
    layers, width = found.scores.shape
    pool = [(la, i) for la in range(layers) for i in range(width)]
    rng = random.Random(0)

    def removed(neurons) -> float:
        bias, _ = trials.measure([NeuronScale(la, i, factor) for la, i in neurons])
        return float(trials.pair_base.mean() - bias.mean())

    tuned_effect = removed([tuple(map(int, label.split(":"))) for label in chosen.neurons])
    assert tuned_effect == pytest.approx(record.confirmation.effect, rel=1e-6)
    randoms = [removed(rng.sample(pool, n)) for _ in range(RANDOM_SETS)]
    assert tuned_effect > max(randoms), (tuned_effect, sorted(randoms)[-3:])
