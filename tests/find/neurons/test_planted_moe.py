"""Proof on a planted expert: what find-neurons finds in a mixture of experts, against brute force.

A tiny Mixtral (2 layers, 4 experts of width 32, top-2) is trained here (~2 min, one thread) on the
planted bias task with the bias computed in expert 0 (tests/planted/moe_bias_train.py: on a
quarter of the prompts expert 0 is silenced and the target carries the capability alone). Ground
truth is brute force: each of the 256 expert neurons zeroed alone through surgery's run-time twin.

Measured on this machine (seed 0), and so what is asserted, with margins:

- The plant holds: expert 0 silenced in both layers removes 100.3 % of the bias gap and 2.2 % of
  the capability margin the *wrong* way (it rises); silencing any other expert costs 40–50 % of the
  capability. The brute-force top neuron is 1:e0:5 (27 %).
- The router sends no token of any pair to experts 1 and 3 of layer 1: their 64 neurons have no
  score, are counted (``unscored_neurons``) and never chosen.
- BiasScore ranks what matters (Spearman ρ 0.85 with |brute-force effect| over the 192 scored
  neurons) and, summed per expert, puts layer 1's expert 0 first in its layer (22.0 against 14.2).
  Its top list is *not* only expert 0: layer-0 neurons of experts 2 and 3, which feed expert 0's
  input, rank high too (brute force agrees: 0:e2:18 is its #2 at 19 %); 6 of the top 20 are
  layer 1's expert 0.
- prune-neurons --n 20 from the findings removes 68 % of the bias gap; 20 seeded random 20-neuron
  sets remove at most 37 % (median 6 %). At n = 10 the margin is thin (38 % against a random max
  of 31 %): in this model the bias is one expert's, not a few neurons'.
"""

from __future__ import annotations

import json
import random
import statistics

import numpy as np
import pytest
import torch
from scipy import stats

from tests.planted.bias_brute import BiasProbe, effects
from tests.planted.bias_task import pair_rows
from tests.planted.bias_train import log_odds
from tests.planted.common import last_logits
from tests.planted.moe_bias_train import MoeBiasTrainConfig, train
from tests.support.cli import cli_env, run_here

pytestmark = pytest.mark.slow(minutes=4)

CFG = MoeBiasTrainConfig()
K = 20
RANDOM_SETS = 20
ENV = cli_env(OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("planted-moe") / "model"
    stats_ = train(out, CFG, log=lambda line: None)
    assert stats_["eval"]["accuracy"] == 1.0, stats_["eval"]
    (out / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pair_rows(CFG.world())), encoding="utf-8")
    return out, AutoModelForCausalLM.from_pretrained(out).eval(), AutoTokenizer.from_pretrained(out)


def _measure(model, tok, probe, edits):
    from surgery.model.hooks import applied

    with applied(model, edits):
        return probe.metrics_of(log_odds(model, tok, probe.texts))


def _zero(layer: int, expert: int, neuron: int):
    from surgery.core.edits import NeuronScale

    return NeuronScale(layer, neuron, 0.0, expert)


def test_planted_expert_is_found_and_pruned(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    path, model, tok = trained
    probe = BiasProbe(CFG.world())
    L, E, I = CFG.layers, CFG.experts, CFG.intermediate
    base = _measure(model, tok, probe, [])
    if abs(base.gap - 2 * CFG.bias) >= 0.15 * 2 * CFG.bias:
        # Training is bit-reproducible on one kind of CPU only (tests/planted/common.same_float_path): on an
        # AVX2-only AMD EPYC seed 0 lands on a weaker plant (gap 3.05; expert 0 silenced removes 76 % of it),
        # and the proportions below were measured on the path that plants the full gap.
        pytest.skip(f"the training took another CPU's float path (bias gap {base.gap:.2f}, planted {2 * CFG.bias:g})")

    # the plant: expert 0 carries the bias and not the capability; the others carry capability
    for e in range(E):
        bias, _, cap = effects(
            base, _measure(model, tok, probe, [_zero(la, e, i) for la in range(L) for i in range(I)])
        )
        if e == CFG.planted:
            assert bias >= 90 and abs(cap) <= 10, (bias, cap)
        else:
            assert cap >= 25, (e, cap)
    truth = {
        (la, e, i): effects(base, _measure(model, tok, probe, [_zero(la, e, i)]))[0]
        for la in range(L)
        for e in range(E)
        for i in range(I)
    }
    assert max(truth, key=truth.get)[1] == CFG.planted

    # find-neurons: every scored neuron ranked; unreached experts counted, not scored
    res = run_here(
        [
            "find-neurons",
            path,
            "--pairs",
            path / "pairs.jsonl",
            "--score",
            "bias",
            "--select",
            "global",
            "--spare-active",
            "0",
            "--n",
            "1",
            "--out",
            tmp_path / "f.json",
            "--json",
        ],
        env=dict(ENV, SURGERY_CACHE=str(tmp_path / "cache")),
    )
    assert res.returncode == 0, res.stderr
    findings = json.loads((tmp_path / "f.json").read_text())
    unscored = findings["experts"]["unscored_neurons"]
    scored = L * E * I - unscored
    from surgery.find.neurons.find import scores_of
    from surgery.find.neurons.record import NeuronsFindings
    from surgery.find.neurons.select import select, selected_edits

    scores = scores_of(NeuronsFindings.from_dict(findings))
    order = [
        (e.layer, e.expert, e.neuron)
        for e in selected_edits(scores, select(scores, scored, score="bias", rule="global", spare_active=0.0), 0.0)
    ]
    assert len(order) == scored and unscored == int((sum(scores.reached.values()) == 0).sum())
    rho = stats.spearmanr([-order.index(k) for k in order], [abs(truth[k]) for k in order])[0]
    assert rho >= 0.7, rho
    bias = scores.pooled("bias", scores.categories)[:, : E * I].reshape(L, E, I)
    assert int(np.nanargmax(np.nansum(bias[L - 1], axis=1))) == CFG.planted
    assert sum(k[:2] == (L - 1, CFG.planted) for k in order[:K]) >= 4, order[:K]

    # prune-neurons --n K from those findings, baked, against random K-neuron sets
    res = run_here(
        [
            "prune-neurons",
            path,
            "--n",
            str(K),
            "--findings",
            tmp_path / "f.json",
            "--score",
            "bias",
            "--select",
            "global",
            "--spare-active",
            "0",
            "--out",
            tmp_path / "pruned",
        ],
        env=dict(ENV, SURGERY_CACHE=str(tmp_path / "cache")),
    )
    assert res.returncode == 0, res.stderr
    edits = json.loads((tmp_path / "pruned" / "surgery.json").read_text())["recipe"]["edits"]
    chosen = [_zero(e["layer"], e["expert"], e["neuron"]) for e in edits]
    assert [(c.layer, c.expert, c.neuron) for c in chosen] == order[:K]
    removed = effects(base, _measure(model, tok, probe, chosen))[0]
    assert removed >= 55, removed
    rng = random.Random(0)
    every = [_zero(la, e, i) for la in range(L) for e in range(E) for i in range(I)]
    baseline = [effects(base, _measure(model, tok, probe, rng.sample(every, K)))[0] for _ in range(RANDOM_SETS)]
    assert max(baseline) < removed - 10 and statistics.median(baseline) < 15, sorted(baseline)

    from surgery.model.hooks import applied

    with torch.no_grad(), applied(model, chosen):
        runtime = last_logits(model, tok, probe.texts)
    with torch.no_grad():
        baked = last_logits(AutoModelForCausalLM.from_pretrained(tmp_path / "pruned").eval(), tok, probe.texts)
    assert (baked - runtime).abs().max().item() <= 1e-4
