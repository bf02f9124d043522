"""Proof on the planted direction model (tests/fixtures/direction_model,
tests/find/directions/test_planted_direction.py): the answer ``no`` to a trigger prompt lives along one
known direction u, and projecting u out of the attention and MLP outputs removes it with a
first-token KL of about 1e-6 nats on the neutral color prompts. The planted optimum of the kernel's
space is a weight near 1 on both writers: every ``no`` gone at almost no cost.

The criterion: the front reaches every marker removed on the tune prompts; under ``max_kl`` 1e-3 (the
planted proof's bound) the chosen point removes every marker on the held-out prompts too, within
that KL; a bake of it is the usual bake, its surgery.json holding the study and the kernel.
"""

from __future__ import annotations

import json

import pytest

from surgery.core.optional import available, install_hint
from tests.support.planted_tune import DIRECTION, refusal_marker

pytestmark = pytest.mark.skipif(not available("optuna"), reason=install_hint("optuna"))

TRIALS = 12
MAX_KL = 1e-3


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    import torch

    import surgery

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("tune-direction")
    found = surgery.find_direction(DIRECTION, a=str(DIRECTION / "a.txt"), b=str(DIRECTION / "b.txt"))
    result = surgery.tune(
        DIRECTION,
        method="direction",
        findings=found.path,
        behaviour=str(DIRECTION / "a.txt"),
        markers=str(refusal_marker(tmp / "markers.txt")),
        neutral=str(DIRECTION / "neutral.txt"),
        max_new_tokens=1,
        trials=TRIALS,
        max_kl=MAX_KL,
        batch_size=64,
        out=tmp / "study",
        bake_out=tmp / "baked",
    )
    return result


def test_the_front_removes_every_marker(tuned):
    record = tuned.record
    assert record.baseline["marker_rate"] == 1.0  # every trigger prompt answered "no" unedited
    assert max(record.trial(n).effect for n in record.front) == 1.0


def test_the_chosen_kernel_removes_the_behaviour_on_held_out_prompts(tuned):
    record = tuned.record
    chosen, c = record.trial(record.chosen.number), record.confirmation
    assert record.chosen.rule == "max_kl" and chosen.kl <= MAX_KL and chosen.effect == 1.0
    assert c.rate_base == 1.0 and c.rate == 0.0 and c.effect_ci95 == [1.0, 1.0] and c.kl_ci95[1] <= MAX_KL, c
    assert set(record.split.test_items).isdisjoint(record.split.tune_items)


def test_the_bake_records_the_study_and_the_kernel(tuned):
    record = tuned.record
    baked = json.loads((tuned.baked.out / "surgery.json").read_text())
    assert baked["tune"]["chosen"]["number"] == record.chosen.number and baked["tune"]["method"] == "direction"
    weights = baked["direction_kernel"]["weights"]
    assert baked["direction_kernel"]["weight"] == pytest.approx(record.trial(record.chosen.number).params["weight"])
    assert {e["layer"] for e in baked["recipe"]["edits"]} == {int(layer) for layer, w in weights.items() if w}
