"""Proof that amplify-heads carries a binding effect when the binding head is specific.

On tests/fixtures/binding_model/ the paper's edge-level α = 2 raises |ΔS| but the bakeable
whole-head α does not: its binding heads also write much else, and scaling all of it helps
nothing (examples/planted_alpha_sweep.py). tests/fixtures/binding_dose/ is the same task trained
so that one layer-0 head is a *specific* binding head (``python examples/train_binding_model.py
--dose-head 3 --dose-share 0.8 --out tests/fixtures/binding_dose``, tests/planted/train.py): it
writes only at the name of an identity bound to the item, attends there to the item in
proportion to the association's strength, and on 80 % of the training prompts its output was
scaled by c ~ U(0, 3) with the target evidence scaled by the same c. So the ground truth is known
twice: brute force finds one head whose edge knockout and whole-head silencing both remove
nearly all of ΔS, and by construction whole-head α should scale the evidence.

The criterion: brute force finds that single head; find-heads selects it first; knocking out its
identity→item edges removes most of ΔS; ``amplify-heads --alpha 2`` on find-heads' selection bakes
a checkpoint that, loaded by stock transformers, raises |ΔS| on held-out prompts by at least
half (measured ×2.04 for its 3 heads) and equals the run-time edit; and |ΔS| grows monotonically with α from 0 to 3.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.planted.brute import Prompts, delta_s, s_of
from tests.planted.fixture import Planted, load_planted
from tests.planted.train import TrainConfig
from tests.support.cli import run_here
from tests.support.paths import FIXTURES
from tests.support.planted_circuit import (
    AMPLIFY,
    CIRCUIT_EFFECT,
    ENV,
    HELD_OUT_SEED,
    LARGE_EFFECT,
    NO_EFFECT,
    PER_ITEM,
    SAME,
    find_heads_cli,
)

DOSE = FIXTURES / "binding_dose"
WHOLE_CIRCUIT = 90.0  # % of ΔS the dosed head alone carries (measured 97.6 on the shipped pairs)
AMPLIFIED = 1.5  # the least factor by which α = 2 must raise |ΔS| (measured 2.04 on the 3 selected heads)
ALPHAS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)


@pytest.fixture(scope="module")
def planted() -> Planted:
    return load_planted(DOSE, f"python examples/train_binding_model.py --dose-head 3 --dose-share 0.8 --out {DOSE}")


@pytest.fixture(scope="module")
def config(planted) -> TrainConfig:
    return planted.config


@pytest.fixture(scope="module")
def loaded(planted):
    return planted.model, planted.tokenizer


@pytest.fixture(scope="module")
def truth(planted):
    return planted.brute_force(PER_ITEM)


@pytest.fixture(scope="module")
def held_out(planted) -> Prompts:
    return planted.pairs(HELD_OUT_SEED, PER_ITEM)


@pytest.fixture(scope="module")
def findings(tmp_path_factory) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("dose")
    return find_heads_cli(DOSE, tmp), tmp


def test_brute_force_finds_one_specific_head(truth, config):
    """The dosed head carries the binding alone: its identity→item edges and the whole head each
    remove nearly all of ΔS (the same amount: it writes nothing else), no other head's edges are
    part of the circuit, and the distractor's edges carry nothing."""
    base, rows = truth
    top = rows[0]
    assert (top.layer, top.head) == (0, config.dose_head), [(r.layer, r.head, round(r.edge, 1)) for r in rows]
    assert base < 0 and top.edge >= WHOLE_CIRCUIT and abs(top.whole - top.edge) < NO_EFFECT, top
    assert all(r.edge < CIRCUIT_EFFECT for r in rows[1:]) and all(abs(r.edge_control) < NO_EFFECT for r in rows)


def test_find_heads_selects_the_binding_head(findings, config):
    """find-heads' confirmed selection starts with the dosed head, and its knockout removes most of
    ΔS, significantly, with nothing from the distractor's edges."""
    f = findings[0]
    assert f["selected_heads"][0] == [0, config.dose_head], f["selected_heads"]
    ko = f["knockout"]
    assert f["scores"]["S"]["p"] < 1e-4 and ko["tested"]["effect_pct"] >= LARGE_EFFECT
    assert ko["tested"]["ci95"][0] > CIRCUIT_EFFECT and abs(ko["control"]["effect_pct"]) < NO_EFFECT
    assert ko["random"]["share_ge_tested"] == 0


def test_amplify_heads_raises_binding_on_held_out_prompts(findings, loaded, held_out):
    """amplify-heads --alpha 2 on find-heads' selection: the baked checkpoint, loaded by stock
    transformers, raises |ΔS| on prompts discovery never saw, exactly as the run-time edit does."""
    from transformers import AutoModelForCausalLM

    from surgery.core.edits import HeadScale
    from surgery.model.hooks import applied

    f, tmp = findings
    out = tmp / "amplified"
    res = run_here(
        ["amplify-heads", DOSE, "--alpha", str(AMPLIFY), "--findings", tmp / "findings.json", "--out", out],
        env=ENV,
    )
    assert res.returncode == 0, res.stderr
    heads = [(e["layer"], e["head"]) for e in json.loads((out / "surgery.json").read_text())["recipe"]["edits"]]
    assert heads == [tuple(h) for h in f["selected_heads"]]
    model, tok = loaded
    base = delta_s(s_of(model, tok, held_out.texts))
    with applied(model, [HeadScale(layer, head, AMPLIFY) for layer, head in heads]):
        runtime = s_of(model, tok, held_out.texts)
    baked = s_of(AutoModelForCausalLM.from_pretrained(out).eval(), tok, held_out.texts)
    assert (baked - runtime).abs().max() < SAME
    assert abs(delta_s(baked)) >= AMPLIFIED * abs(base), (base, delta_s(baked))


def test_binding_follows_the_dose(loaded, held_out, config):
    """Whole-head α on the dosed head, 0 to 3: |ΔS| on held-out prompts rises with every step, and
    α = 0 removes nearly all of it."""
    from surgery.core.edits import HeadScale
    from surgery.model.hooks import applied

    model, tok = loaded
    curve = []
    for alpha in ALPHAS:
        with applied(model, [HeadScale(0, config.dose_head, alpha)]):
            curve.append(abs(delta_s(s_of(model, tok, held_out.texts))))
    assert all(a < b for a, b in zip(curve, curve[1:])), curve
    assert curve[0] < (1 - WHOLE_CIRCUIT / 100) * curve[ALPHAS.index(1.0)], curve
