"""Finding expert neurons in mixtures of experts: capture over routed tokens, scores, selection, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from surgery.find.neurons.experts import capture_experts
from surgery.find.neurons.pairs import load_pairs
from surgery.find.neurons.ppm import ppm_scores
from surgery.find.neurons.scores import NeuronScores, accumulate_pair_sums
from surgery.find.neurons.select import select, selected_edits
from tests.support.cli import main_output
from tests.support.neuron_pairs import write_pairs
from tests.support.tokenizer import char_tokenizer, save_char_tokenizer


def _model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _alone(model, tok, text: str) -> tuple[np.ndarray, np.ndarray]:
    """One prompt, no batch, no padding: each layer's experts' mean activation over routed tokens
    ([layers, E, I], NaN where unreached) and routing share ([layers, E]), by the experts' own math."""
    seen = {}
    hooks = [
        layer.mlp.experts.register_forward_hook(
            lambda m, a, kw, o, i=i: seen.__setitem__(i, (m, *(list(a) + list(kw.values()))[:2])), with_kwargs=True
        )
        for i, layer in enumerate(model.model.layers)
    ]
    with torch.no_grad():
        model(input_ids=tok(text, return_tensors="pt").input_ids)
    for h in hooks:
        h.remove()
    means, shares = [], []
    with torch.no_grad():
        for i in range(len(seen)):
            m, x, index = seen[i]
            w = m.gate_up_proj.transpose(1, 2) if m.is_transposed else m.gate_up_proj  # [E, 2I, H]
            b = m.gate_up_proj_bias if m.has_bias else torch.zeros(w.shape[:2])
            h = torch.stack([m._apply_gate(x @ w[e].T + b[e]) for e in range(w.shape[0])])  # [E, T, I]
            hit = torch.stack([(index == e).any(-1) for e in range(w.shape[0])])  # [E, T]
            with np.errstate(invalid="ignore"):
                means.append((h * hit[..., None]).sum(1).numpy() / hit.sum(1, keepdim=True).numpy())
            shares.append(hit.float().mean(1).numpy())
    return np.stack(means), np.stack(shares)


@pytest.mark.parametrize("arch", ["mixtral", "gpt_oss"])
def test_batched_capture_equals_each_prompt_alone(tiny, arch):
    model, tok = _model(tiny(arch)), char_tokenizer(bos=True)
    texts = ["The nurse said that", "A man", "Our old neighbour is kind", "x"]
    got = []
    capture_experts(model, tok, texts, lambda s, p, r: got.append((p, r)), batch_size=4)
    ((pooled, share),) = got
    for k, text in enumerate(texts):
        mean, ref_share = _alone(model, tok, text)
        np.testing.assert_allclose(pooled[k].numpy(), mean.reshape(mean.shape[0], -1), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(share[k].numpy(), ref_share, atol=1e-6)
    # a 2-token prompt with top-2 of 4 experts leaves experts unreached: NaN, not 0
    assert torch.isnan(pooled[3]).any() and not torch.isnan(pooled[0]).all()


def test_unreached_experts_have_no_score_and_are_never_chosen(tiny, tmp_path):
    model = _model(tiny("qwen2_moe"))
    pairs = load_pairs(write_pairs(tmp_path / "pairs.jsonl")).pairs[:6]
    sums, ppm = accumulate_pair_sums(model, char_tokenizer(bos=True), pairs, 2), ppm_scores(model)
    scores = NeuronScores.from_sums(sums, ppm)
    assert scores.to_dict() == NeuronScores.stored(sums, ppm)  # NaN as None, reached counts as ints
    assert scores.shape == (3, 4 * 16 + 24) and scores.experts == (4, 16, 24)
    reached = sum(scores.reached.values())
    assert (reached[:, 64:] == len(pairs)).all()  # the shared expert sees every token
    total = scores.pooled("bias", scores.categories)
    assert np.array_equal(np.isnan(total), reached == 0) and scores.unscored() == int((reached == 0).sum())
    chosen = select(scores, 40, score="bias", rule="global", spare_active=0.0)
    assert all(reached[layer, col] > 0 for layer, col in chosen.neurons)
    # round trip through the findings file keeps the NaNs (null) and the counts
    again = NeuronScores.from_dict(json.loads(json.dumps(scores.to_dict())))
    assert np.array_equal(np.isnan(again.pooled("bias", again.categories)), reached == 0)
    edits = selected_edits(scores, chosen, 0.0)
    assert {e.expert for e in edits} <= set(range(4)) | {"shared"}


def test_find_and_prune_n_on_a_moe(tiny, tmp_path, capsys):
    """find-neurons reports experts and routing; prune-neurons --n 40 bakes expert edits, checked."""
    src = save_char_tokenizer(tiny("olmoe"), bos=True)
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    code, out, err = main_output(
        capsys, "find-neurons", src, "--pairs", pairs, "--n", "5", "--out", tmp_path / "f.json"
    )
    assert code == 0, err
    assert "Routing share" in out and "expert neurons unscored" in out
    findings = json.loads((tmp_path / "f.json").read_text())
    report = findings["experts"]
    assert report["experts"] == 4 and set(report["routing"]) == set(findings["scores"]["categories"])
    assert findings["parameters"]["site"].startswith("expert intermediate")
    assert all("label" in r and ":e" in r["label"] for r in findings["summary"]["neurons"])
    from surgery.ship.report import build_report

    text = build_report([tmp_path / "f.json"], [], tmp_path / "report").read_text()
    first = findings["summary"]["neurons"][0]
    assert f"| {first['layer']} | {first['label']} |" in text and "routing share, stereotyped − other" in text
    code, out, err = main_output(capsys, "prune-neurons", src, "--pairs", pairs, "--n", "40", "--out", tmp_path / "p")
    assert code == 0, err
    prov = json.loads((tmp_path / "p" / "surgery.json").read_text())
    edits = prov["recipe"]["edits"]
    assert len(edits) == 40 and all("expert" in e for e in edits)
    assert prov["verification"]["kind"] == "edited maps" and prov["verification"]["max_diff_over_bound"] <= 1.0
