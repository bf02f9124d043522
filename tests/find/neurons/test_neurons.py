"""Neuron scores against plain-loop references, selection rules, and the scores' file round trip."""

from __future__ import annotations

import json
from itertools import product

import numpy as np
import pytest
import torch

from surgery.find.neurons.pairs import load_pairs
from surgery.find.neurons.ppm import ppm_scores
from surgery.find.neurons.scores import (
    DIGITS,
    NeuronScores,
    SelectionError,
    accumulate_pair_sums,
    fairness_score,
    rounded,
)
from surgery.find.neurons.select import allowed_mask, category_overlap, layer_distribution, select
from surgery.model.hooks import layer_module, model_architecture
from tests.support.neuron_capture import load_with_char_tokenizer, reference_pooled
from tests.support.neuron_pairs import write_pairs


def reference_scores(model, tok, pairs):
    """Per category: mean |p1 − p2|, mean (stereotyped − other), mean |p|; one prompt at a time."""
    diffs: dict[str, list] = {}
    for p in pairs:
        a, b = (reference_pooled(model, tok, t).double() for t in (p.prompt_1, p.prompt_2))
        diffs.setdefault(p.category, []).append((a - b, 1 if p.stereotyped == 1 else -1, (a.abs() + b.abs()) / 2))
    bias = {c: torch.stack([d.abs() for d, _, _ in v]).mean(0).numpy() for c, v in diffs.items()}
    signed = {c: torch.stack([d * s for d, s, _ in v]).mean(0).numpy() for c, v in diffs.items()}
    activation = {c: torch.stack([m for _, _, m in v]).mean(0).numpy() for c, v in diffs.items()}
    return bias, signed, activation


def reference_ppm(model) -> np.ndarray:
    arch = model_architecture(model)
    g = arch.geometry
    out = np.zeros((g.num_layers, g.intermediate_size))
    for layer, i in product(range(g.num_layers), range(g.intermediate_size)):
        if arch.layout.mlp.gate_up_proj:
            w = layer_module(model, arch, layer, arch.layout.mlp.gate_up_proj).weight.detach()
            gate, up = w[i], w[g.intermediate_size + i]
        else:
            gate = layer_module(model, arch, layer, arch.layout.mlp.gate_proj).weight.detach()[i]
            up = layer_module(model, arch, layer, arch.layout.mlp.up_proj).weight.detach()[i]
        out[layer, i] = float(max(gate)) + abs(float(min(gate))) + float(max(up)) + abs(float(min(up)))
    return out


def reference_fairness(bias: np.ndarray, ppm: np.ndarray, w: float) -> np.ndarray:
    out = np.zeros_like(bias)
    for layer in range(bias.shape[0]):
        b, p = list(bias[layer]), list(ppm[layer])
        for i in range(len(b)):
            nb = (b[i] - min(b)) / (max(b) - min(b))
            np_ = (p[i] - min(p)) / (max(p) - min(p))
            out[layer, i] = w * nb + (1 - w) * (1 - np_)
    return out


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "phi3"])
def test_scores_match_plain_loop_reference(tiny, tmp_path, arch):
    model, tok = load_with_char_tokenizer(tiny(arch))
    pairs = [p for p in load_pairs(write_pairs(tmp_path / "p.jsonl")).pairs if p.attribute_1 != "fat"]
    sums = accumulate_pair_sums(model, tok, pairs, batch_size=2)  # 2 pairs = 4 padded prompts a pass
    ppm = ppm_scores(model)
    table = NeuronScores.from_sums(sums, ppm)
    stored = NeuronScores.stored(sums, ppm)  # what find-neurons writes: rounded once, read back unchanged
    assert table.to_dict() == stored and NeuronScores.from_dict(stored).to_dict() == stored
    bias, signed, activation = reference_scores(model, tok, pairs)
    assert table.categories == sorted(bias) and table.counts == {"Age": 6, "Gender": 3, "SES": 3}
    for c in bias:
        np.testing.assert_allclose(table.bias[c], bias[c], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(table.signed[c], signed[c], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(table.activation[c], activation[c], rtol=1e-5, atol=1e-7)
        assert np.abs(table.signed[c]).max() > 1e-6
    # signed ≠ unsigned: Age mixes stereotyped sides 1 and 2
    assert not np.allclose(np.abs(table.signed["Age"]), table.bias["Age"])
    np.testing.assert_allclose(ppm, reference_ppm(model), rtol=1e-6)
    pooled = (table.bias["Age"] * 6 + table.bias["Gender"] * 3 + table.bias["SES"] * 3) / 12
    np.testing.assert_allclose(table.pooled("bias", table.categories), pooled, rtol=1e-9)
    np.testing.assert_allclose(
        table.score("fairness", ["Age"], 0.7), reference_fairness(table.bias["Age"], table.ppm, 0.7), rtol=1e-9
    )
    np.testing.assert_allclose(table.score("signed", ["Gender"]), np.abs(table.signed["Gender"]))


def synthetic(seed: int = 0, layers: int = 4, width: int = 10, cats=("A", "B", "C")) -> NeuronScores:
    rng = np.random.default_rng(seed)
    return NeuronScores(
        {c: 2 + k for k, c in enumerate(cats)},
        {c: rng.random((layers, width)) for c in cats},
        {c: rng.normal(size=(layers, width)) for c in cats},
        {c: rng.random((layers, width)) for c in cats},
        rng.random((layers, width)) + 1,
    )


def _flat(neurons, width=10):
    return [layer * width + i for layer, i in neurons]


def test_global_selection_is_top_n_of_the_pooled_score():
    s = synthetic()
    for score in ("bias", "signed", "fairness"):
        values = s.score(score, s.categories).ravel()
        chosen = select(s, 7, score=score, rule="global", spare_active=0)
        assert _flat(chosen.neurons) == list(np.argsort(-values, kind="stable")[:7])
        assert chosen.labels == ("pooled",) * 7


def test_per_category_selection_takes_turns():
    s = synthetic()
    chosen = select(s, 9, score="bias", rule="per-category", spare_active=0)
    ranks = {c: list(np.argsort(-s.bias[c].ravel(), kind="stable")) for c in s.categories}
    taken: list[int] = []
    while len(taken) < 9:  # plain reference of the round robin
        for c in s.categories:
            nxt = next(i for i in ranks[c] if i not in taken)
            if len(taken) < 9:
                taken.append(nxt)
    assert _flat(chosen.neurons) == taken
    assert chosen.labels == ("A", "B", "C") * 3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_intersection_matches_growing_top_k(seed):
    s = synthetic(seed)
    n = 6
    chosen = select(s, n, score="fairness", rule="intersection", spare_active=0)
    tops = {c: list(np.argsort(-s.score("fairness", [c]).ravel(), kind="stable")) for c in s.categories}
    pooled = list(np.argsort(-s.score("fairness", s.categories).ravel(), kind="stable"))
    for k in range(1, 41):  # smallest k whose intersection of top-k lists holds n neurons
        inter = set.intersection(*(set(t[:k]) for t in tops.values()))
        if len(inter) >= n:
            break
    before = set.intersection(*(set(t[: k - 1]) for t in tops.values()))
    boundary = [i for i in pooled if i in inter - before][: n - len(before)]
    assert len(before) < n
    assert _flat(chosen.neurons) == [i for i in pooled if i in before or i in boundary]


def test_layer_restriction_and_single_category():
    s = synthetic()
    chosen = select(s, 5, score="bias", rule="global", layers=[1, 3], categories=["b"], spare_active=0)
    assert {layer for layer, _ in chosen.neurons} <= {1, 3}
    masked = s.bias["B"].copy()
    masked[[0, 2]] = -np.inf
    assert _flat(chosen.neurons) == list(np.argsort(-masked.ravel(), kind="stable")[:5])
    assert chosen.categories == ("B",) and chosen.layers == (1, 3)
    assert layer_distribution(chosen, 4) == [
        0,
        sum(1 for l, _ in chosen.neurons if l == 1),
        0,
        sum(1 for l, _ in chosen.neurons if l == 3),
    ]


def test_sparing_the_most_active_neurons_of_each_layer():
    s = synthetic(width=20)
    activity = s.pooled("activation", s.categories)
    mask = allowed_mask(s, None, 0.1)  # 2 of 20 per layer
    for layer in range(4):
        top2 = set(np.argsort(-activity[layer])[:2].tolist())
        assert set(np.flatnonzero(~mask[layer]).tolist()) == top2
    for rule in ("global", "per-category", "intersection"):
        chosen = select(s, 30, score="bias", rule=rule, spare_active=0.1)
        assert all(mask[layer, i] for layer, i in chosen.neurons)
    planted = s.bias["A"].copy()
    hot = np.unravel_index(np.argmax(activity), activity.shape)
    planted[hot] = 100.0  # the most biased neuron is also its layer's most active one
    s.bias["A"] = s.bias["B"] = s.bias["C"] = planted
    assert tuple(map(int, hot)) == select(s, 1, score="bias", spare_active=0).neurons[0]
    assert tuple(map(int, hot)) not in select(s, 10, score="bias", spare_active=0.05).neurons


def test_selection_errors():
    s = synthetic()
    with pytest.raises(SelectionError, match=r"--n 41 is out of range: the model has 40 selectable MLP neurons"):
        select(s, 41, spare_active=0)
    with pytest.raises(SelectionError, match=r"36 selectable MLP neurons \(4 layers × 10, after sparing the 0.1 most"):
        select(s, 37, spare_active=0.1)
    with pytest.raises(SelectionError, match="these layers hold 10"):
        select(s, 11, layers=[2], spare_active=0)
    with pytest.raises(SelectionError, match="layers 0..3"):
        select(s, 1, layers=[4])
    with pytest.raises(SelectionError, match="category Z is not in the findings; they hold A, B, C"):
        select(s, 1, categories=["Z"])
    with pytest.raises(SelectionError, match="bias-weight"):
        fairness_score(s.bias["A"], s.ppm, 1.5)
    with pytest.raises(SelectionError, match="spare-active"):
        select(s, 1, spare_active=1.0)
    assert len(select(s, 40, rule="intersection", spare_active=0).neurons) == 40


def test_overlap_is_a_jaccard_matrix():
    s = synthetic()
    chosen = select(s, 8, score="bias", rule="global", spare_active=0)
    overlap = category_overlap(s, chosen)
    tops = [set(np.argsort(-s.bias[c].ravel(), kind="stable")[:8].tolist()) for c in s.categories]
    m = overlap["jaccard"]
    assert overlap["categories"] == ["A", "B", "C"] and all(m[i][i] == 1.0 for i in range(3))
    assert m[0][1] == round(len(tops[0] & tops[1]) / len(tops[0] | tops[1]), 4) == m[1][0]


def test_scores_survive_the_file_round_trip():
    s = synthetic()
    back = NeuronScores.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back.counts == s.counts
    np.testing.assert_allclose(back.bias["A"], s.bias["A"], rtol=1e-5)
    np.testing.assert_allclose(back.ppm, s.ppm, rtol=1e-5)
    np.testing.assert_allclose(back.activation["C"], s.activation["C"], rtol=1e-5)
    broken = s.to_dict()
    broken["width"] = 11
    with pytest.raises(SelectionError, match="do not match"):
        NeuronScores.from_dict(broken)


def test_stored_scores_are_pythons_six_digits_with_null_for_no_score():
    """What a findings file holds: each score as float(f"{v:.6g}") (the bytes files had before the
    array rounding), an expert neuron no pair reached as null."""
    x = np.random.default_rng(3).standard_normal((4, 50)) * 10.0 ** np.arange(-8, 2, 0.05).reshape(4, 50)
    x[1, 7] = x[3, 0] = np.nan
    x[2, 2] = -0.0
    want = [[None if v != v else float(f"{v:.{DIGITS}g}") for v in row] for row in x.tolist()]
    got = rounded(x)
    assert json.dumps(got) == json.dumps(want)
    assert got[1][7] is None and got[0] == want[0]


def test_ppm_of_an_ungated_mlp_reads_its_one_input_matrix(tmp_path, monkeypatch):
    """PPM follows the table's MLP input rows: an ungated MLP (Starcoder2's c_fc → c_proj, added as a
    row in this test only) has one input row per neuron, and scoring it needs no gate_proj."""
    import transformers as tf

    from surgery.core import architectures
    from surgery.core.architectures import Layout, Mlp
    from tests.support.tiny import BASE

    monkeypatch.setitem(
        architectures.ARCHITECTURES,
        "starcoder2",
        Layout(mlp=Mlp(down_proj="mlp.c_proj", gate_proj=None, up_proj="mlp.c_fc")),
    )
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(
        tf.Starcoder2Config(**{k: v for k, v in BASE.items() if k != "head_dim"})
    ).eval()
    arch = model_architecture(model)
    up = np.stack(
        [
            layer_module(model, arch, layer, "mlp.c_fc").weight.detach().double().numpy()
            for layer in range(arch.geometry.num_layers)
        ]
    )
    np.testing.assert_allclose(ppm_scores(model), up.max(axis=2) + np.abs(up.min(axis=2)), rtol=1e-6)


def test_fresh_findings_show_the_summary_their_file_stores(tiny, tmp_path, monkeypatch):
    """find-neurons computes its summary once: what it shows under the defaults is the file's
    summary, and equals a selection made anew from the file's scores."""
    from surgery.api.params import SelectParams
    from surgery.core.checkpoint import Checkpoint
    from surgery.find.neurons.find import NeuronFindings, describe, find_neurons
    from surgery.model.loading import LoadSpec
    from tests.support.tokenizer import save_char_tokenizer

    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache"))
    model = save_char_tokenizer(tiny("llama"), bos=True)
    pairs = load_pairs(str(write_pairs(tmp_path / "pairs.jsonl")))
    found = find_neurons(Checkpoint(model), pairs, load=LoadSpec(device="cpu"), recompute=True)
    stored = found.data.summary
    shown = found.shown(stored.n, SelectParams())
    assert shown.to_dict() == stored.to_dict()
    assert found.shown(stored.n, SelectParams()) is shown  # made once
    again = NeuronFindings.read(found.path, Checkpoint(model))  # the file, parsed anew
    assert describe(again.scores, again.select(stored.n, SelectParams())).to_dict() == stored.to_dict()
    assert again.scores.to_dict() == found.scores.to_dict()
    other = found.shown(3, SelectParams(rule="global"))
    assert other.n == 3 and other.rule == "global"


def _full_ranking(values: np.ndarray, allowed: np.ndarray) -> list[int]:
    """The ranking by a full stable sort (what selection read before it stopped at the first n)."""
    ok = allowed.ravel()
    flat = np.where(ok & ~np.isnan(values.ravel()), values.ravel(), -np.inf)
    order = np.argsort(-flat, kind="stable")
    return order[ok[order]].tolist()


@pytest.mark.parametrize("seed", range(6))
def test_the_first_n_of_a_ranking_without_sorting_every_neuron(seed):
    """Ties (scores on a few levels, ±0), unscored (NaN) and disallowed neurons: the first n found by a
    partition are the full stable ranking's first n, and so are the selections made from them."""
    from surgery.find.neurons.select import _ranking

    rng = np.random.default_rng(seed)
    layers, width = 6, 40
    values = rng.integers(0, 7, (layers, width)) / 4.0  # many ties
    values[rng.random((layers, width)) < 0.05] = np.nan
    values[0, :3] = [0.0, -0.0, 0.0]
    allowed = rng.random((layers, width)) < 0.9
    full = _full_ranking(values, allowed)
    for n in (1, 2, 5, 37, len(full) - 1, len(full), len(full) + 3):
        assert _ranking(values, allowed, n).tolist() == full[:n], n
    cats = ("A", "B", "C", "D")
    s = NeuronScores(
        {c: 3 for c in cats},
        *({c: rng.integers(0, 5, (layers, width)) / 8.0 for c in cats} for _ in range(3)),
        rng.random((layers, width)) + 1,
    )
    for n, rule, score in product((1, 9, 60, 200), ("global", "per-category"), ("bias", "fairness")):
        chosen = select(s, n, score=score, rule=rule, spare_active=0.05)
        allowed = allowed_mask(s, None, 0.05)
        if rule == "global":
            want = _full_ranking(s.score(score, s.categories), allowed)[:n]
        else:  # each category's best untaken neuron in turn, over its full ranking
            rankings = [_full_ranking(s.score(score, [c]), allowed) for c in cats]
            taken: dict[int, str] = {}
            cursors = [0] * len(cats)
            while len(taken) < n:
                for k, ranking in enumerate(rankings):
                    while ranking[cursors[k]] in taken:
                        cursors[k] += 1
                    if len(taken) < n:
                        taken[ranking[cursors[k]]] = cats[k]
            want = list(taken)
            assert list(chosen.labels) == list(taken.values())
        assert [layer * width + i for layer, i in chosen.neurons] == want, (n, rule, score)
