"""optipfair's ``analyze_neuron_bias`` score, as surgery computes it, against a plain-hook reference.

That library scores each neuron by mean over all pairs of |mean over tokens (prompt 1) − mean over
tokens (prompt 2)|, one prompt per forward pass, at the down_proj input (its opt-in
``down_proj_input`` target) or, by default, at the gate_proj and up_proj outputs.
examples/bench_optipfair.py compares surgery with the library itself; these tests pin surgery's
side without it: the reference below runs one prompt at a time, with plain forward hooks on the
named Llama modules, through the whole model.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from surgery.core.errors import SurgeryError
from surgery.find.neurons.capture import GATE_UP_OUTPUTS, capture_pooled
from surgery.find.neurons.pairs import load_pairs
from surgery.find.neurons.ppm import ppm_scores
from surgery.find.neurons.scores import NeuronScores, accumulate_pair_sums
from tests.support.neuron_capture import TEXTS, load_with_char_tokenizer
from tests.support.neuron_pairs import write_pairs


def naive_bias(model, tok, pairs, site: str) -> dict[str, np.ndarray]:
    """{module: [layers, width]}: optipfair's loop written out with forward hooks on each layer's
    ``mlp.down_proj`` input, or on the ``mlp.gate_proj`` and ``mlp.up_proj`` outputs."""
    names = ("down_proj",) if site == "down_proj" else ("gate_proj", "up_proj")
    seen: dict[tuple[str, int], torch.Tensor] = {}
    handles = []
    for layer, block in enumerate(model.model.layers):
        for name in names:
            module = getattr(block.mlp, name)
            if name == "down_proj":
                hook = module.register_forward_pre_hook(lambda m, a, k=(name, layer): seen.__setitem__(k, a[0]))
            else:
                hook = module.register_forward_hook(lambda m, a, out, k=(name, layer): seen.__setitem__(k, out))
            handles.append(hook)
    diffs: dict[str, list[np.ndarray]] = {name: [] for name in names}
    try:
        for p in pairs:
            pooled = []
            for text in (p.prompt_1, p.prompt_2):
                seen.clear()
                with torch.no_grad():
                    model(**tok(text, return_tensors="pt"))
                pooled.append({k: v.double().mean(dim=(0, 1)).numpy() for k, v in seen.items()})
            for name in names:
                diffs[name].append(
                    np.stack(
                        [
                            np.abs(pooled[0][name, layer] - pooled[1][name, layer])
                            for layer in range(len(model.model.layers))
                        ]
                    )
                )
    finally:
        for h in handles:
            h.remove()
    return {name: np.mean(d, axis=0) for name, d in diffs.items()}


@pytest.fixture
def llama_and_pairs(tiny, tmp_path):
    model, tok = load_with_char_tokenizer(tiny("llama"))
    # equal-length pairs only (what find-neurons keeps), of three categories with unequal counts
    pairs = [p for p in load_pairs(write_pairs(tmp_path / "p.jsonl")).pairs if p.attribute_1 != "fat"]
    return model, tok, pairs


def test_find_neurons_pooled_bias_is_optipfairs_down_proj_input_score(llama_and_pairs):
    model, tok, pairs = llama_and_pairs
    table = NeuronScores.from_sums(accumulate_pair_sums(model, tok, pairs, batch_size=2), ppm_scores(model))
    ours = table.pooled("bias", table.categories)  # pair-weighted over categories = the mean over all pairs
    reference = naive_bias(model, tok, pairs, "down_proj")["down_proj"]
    assert len(table.categories) == 3 and len(set(table.counts.values())) == 2
    assert reference.min() > 0
    np.testing.assert_allclose(ours, reference, rtol=1e-5)  # findings keep 6 significant digits
    top = 10
    assert set(np.argsort(-ours, axis=None)[:top]) == set(np.argsort(-reference, axis=None)[:top])


def test_gate_up_outputs_site_is_optipfairs_default_score(llama_and_pairs):
    model, tok, pairs = llama_and_pairs
    width = model.config.intermediate_size
    sums = accumulate_pair_sums(model, tok, pairs, batch_size=2, site=GATE_UP_OUTPUTS)
    ours = sums.mean_abs()
    reference = naive_bias(model, tok, pairs, "gate_up")
    assert ours.shape == (model.config.num_hidden_layers, 2 * width)
    np.testing.assert_allclose(ours[:, :width], reference["gate_proj"], rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(ours[:, width:], reference["up_proj"], rtol=1e-5, atol=1e-9)
    assert not np.allclose(reference["gate_proj"], reference["up_proj"])


def test_fused_gate_up_is_split_like_separate_projections(tiny):
    """Phi-3's fused gate_up output is already [gate | up]: the site is that output as it is."""
    model, tok = load_with_char_tokenizer(tiny("phi3"))
    got = []
    capture_pooled(model, tok, TEXTS, lambda start, pooled: got.append(pooled), batch_size=4, site=GATE_UP_OUTPUTS)
    outputs = {}
    hooks = [
        block.mlp.gate_up_proj.register_forward_hook(lambda m, a, out, k=k: outputs.__setitem__(k, out))
        for k, block in enumerate(model.model.layers)
    ]
    with torch.no_grad():
        model(**tok(TEXTS[0], return_tensors="pt"))
    for h in hooks:
        h.remove()
    reference = torch.stack([outputs[k][0].mean(0) for k in sorted(outputs)])
    assert got[0].shape[-1] == 2 * model.config.intermediate_size
    assert (got[0][0] - reference).abs().max().item() <= 1e-5


def test_unknown_site_and_experts_at_gate_up_are_errors(tiny, llama_and_pairs):
    model, tok, pairs = llama_and_pairs
    with pytest.raises(SurgeryError, match="unknown capture site 'mlp'; choose one of down_proj input, gate/up"):
        capture_pooled(model, tok, TEXTS, lambda s, p: None, site="mlp")
    moe, moe_tok = load_with_char_tokenizer(tiny("qwen3_moe"))
    with pytest.raises(SurgeryError, match="mixture of experts is captured at its experts' down_proj input"):
        accumulate_pair_sums(moe, moe_tok, pairs, site=GATE_UP_OUTPUTS)
