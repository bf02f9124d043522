"""The knockout confirmation on a decoy: a planted circuit that L1 discovery alone ranks last.

tests/fixtures/binding_decoy/ is the planted-circuit task trained with 4 heads of 4 dimensions
(``python examples/train_binding_model.py --seed 0 --heads 4 --head-dim 4 --out
tests/fixtures/binding_decoy``). Its binding runs through layer 0, but heads of layers 1–2 whose
identity→item attention merely *reads* the bound residual stream separate match from mismatch
prompts best, so discovery ranks them first and knocking out its top 3 removes nothing.

The criterion (support.planted_circuit.check_confirmed_selection, plus): find-heads' confirmed
selection is exactly the brute-force circuit (every head whose own edge knockout removes at least
CIRCUIT_EFFECT % of ΔS), and knocking it out removes most of ΔS, significantly, while discovery's
top 3 are all outside the circuit; the screened procedure (the default) selects what --exhaustive selects.
"""

from __future__ import annotations

import json

import pytest

from tests.planted.fixture import load_planted
from tests.support.paths import FIXTURES
from tests.support.planted_circuit import (
    CIRCUIT_EFFECT,
    LARGE_EFFECT,
    NO_EFFECT,
    PER_ITEM,
    TOP,
    check_confirmed_selection,
    check_screen_agrees,
    circuit,
    find_heads_cli,
)

DECOY = FIXTURES / "binding_decoy"


@pytest.fixture(scope="module")
def decoy_truth() -> tuple[float, list]:
    """Brute force on the decoy (every head's edges knocked out alone), largest effect first."""
    planted = load_planted(
        DECOY, f"python examples/train_binding_model.py --seed 0 --heads 4 --head-dim 4 --out {DECOY}"
    )
    return planted.brute_force(PER_ITEM)


@pytest.fixture(scope="module")
def decoy_findings(tmp_path_factory) -> dict:
    return find_heads_cli(DECOY, tmp_path_factory.mktemp("decoy"), "--exhaustive")


def test_the_decoy_circuit_is_what_the_shipped_ground_truth_says(decoy_truth):
    """Brute force here (fewer pairs) finds the circuit heads of the shipped ground_truth.json."""
    shipped = json.loads((DECOY / "ground_truth.json").read_text())
    heads = {(r["layer"], r["head"]) for r in shipped["heads"] if r["edge"] >= CIRCUIT_EFFECT}
    assert set(circuit(decoy_truth)) == heads and len(heads) == TOP


def test_discovery_alone_ranks_readers_first(decoy_findings, decoy_truth):
    """What makes it a decoy: discovery's top 3 hold no circuit head, and the confirmation measured
    each of them alone at under NO_EFFECT % (they are among its candidates)."""
    top = [(h["layer"], h["head"]) for h in decoy_findings["discovery"]["heads"][:TOP]]
    assert not set(top) & set(circuit(decoy_truth)), top
    alone = {(h["layer"], h["head"]): h["effect_pct"] for h in decoy_findings["confirmation"]["heads"]}
    assert all(abs(alone[h]) < NO_EFFECT for h in top), alone


def test_confirmed_selection_recovers_the_circuit(decoy_findings, decoy_truth):
    """The confirmed selection is the brute-force circuit, and its knockout removes most of ΔS."""
    f = decoy_findings
    check_confirmed_selection(f, decoy_truth)
    assert {tuple(h) for h in f["selected_heads"]} == set(circuit(decoy_truth))
    ko = f["knockout"]
    assert f["scores"]["S"]["p"] < 1e-4 and f["scores"]["S"]["delta"] < 0
    assert ko["tested"]["effect_pct"] >= LARGE_EFFECT and ko["tested"]["ci95"][0] > CIRCUIT_EFFECT
    assert abs(ko["control"]["effect_pct"]) < NO_EFFECT and ko["random"]["share_ge_tested"] == 0


@pytest.fixture(scope="module")
def decoy_screened(tmp_path_factory) -> dict:
    return find_heads_cli(DECOY, tmp_path_factory.mktemp("decoy-screened"))


def test_the_screened_procedure_selects_what_the_exhaustive_one_selects(decoy_findings, decoy_screened):
    """The screen puts the circuit forward although discovery ranks it last: the default selects what
    --exhaustive (discovery's top 10 knocked out alone) selects."""
    check_screen_agrees(decoy_screened, decoy_findings)
