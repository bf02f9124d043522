"""find-neurons on every mixture-of-experts family of issue 24: findings computed, and the capture
equal to each family's own math (routed top-k, Llama 4's dense dispatch, dense layers among experts)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import surgery
from surgery.core.architectures import architecture
from surgery.find.neurons.experts import capture_experts
from tests.support.installed import family_param
from tests.support.models import load_fp32
from tests.support.neuron_pairs import write_pairs
from tests.support.tiny_moe import FAMILIES
from tests.support.tokenizer import char_tokenizer, save_char_tokenizer

DEFAULT = ("deepseek_v3", "granitemoeshared", "llama4", "minimax_m3_vl_text", "lfm2_moe")
CASES = [family_param(f, *(() if f in DEFAULT else (pytest.mark.slow(minutes=0.3),))) for f in FAMILIES]


@pytest.mark.parametrize("model_type", CASES)
def test_findings_on_each_family_and_their_top_n_bake(tiny, tmp_path, model_type):
    """Every neuron the family has gets a column (routed, shared, dense-layer ones), the real ones a
    PPM, the shared and dense ones a score from every pair; the top n bake and pass the bake's check."""
    src = save_char_tokenizer(tiny(model_type), bos=True)
    found = surgery.find_neurons(src, pairs=write_pairs(tmp_path / "pairs.jsonl"))
    scores, arch = found.scores, architecture(json.loads((src / "config.json").read_text()))
    g = arch.geometry
    dense = [layer for layer in range(g.num_layers) if not arch.is_sparse(layer)]
    assert scores.shape[0] == g.num_layers and scores.dense_layers == tuple(dense)
    real = scores.neurons()
    assert np.isfinite(scores.ppm[real]).all() and np.isnan(scores.ppm[~real]).all()
    bias = scores.pooled("bias", scores.categories)
    routed = g.num_experts * g.expert_size
    for layer in range(g.num_layers):
        if layer in dense:
            assert np.isfinite(bias[layer, : g.intermediate_size]).all()
        else:
            assert np.isfinite(bias[layer, :routed]).any()  # some expert was reached
            assert np.isfinite(bias[layer, routed : routed + g.shared_size]).all()
    baked = surgery.prune_neurons(src, tmp_path / "pruned", n=12)
    prov = json.loads((tmp_path / "pruned" / "surgery.json").read_text())
    assert len(prov["recipe"]["edits"]) == 12 and prov["verification"]["max_diff_over_bound"] <= 1.0
    assert baked is not None


def _pooled(model, texts):
    got = []
    capture_experts(model, char_tokenizer(bos=True), texts, lambda s, p, r: got.append((p, r)), batch_size=len(texts))
    return got[0]


def test_dense_dispatch_capture_is_the_routers_top_k(tiny):
    """Llama 4: an expert's neurons are pooled over the tokens whose router top-k holds the expert,
    h = act(gate(s·x))·up(s·x) with s the router's sigmoid score — computed here from the router."""
    model = load_fp32(tiny("llama4_text"))
    texts = ["The nurse said that", "A man", "Our old neighbour is kind"]
    pooled, share = _pooled(model, texts)
    tok, layer = char_tokenizer(bos=True), 1  # the routing layer of dense, sparse, dense
    block = model.model.layers[layer].feed_forward
    seen = {}
    handle = block.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0]))
    I, E, k = block.experts.expert_dim, block.num_experts, block.top_k
    for n, text in enumerate(texts):
        with torch.no_grad():
            model(input_ids=tok(text, return_tensors="pt").input_ids)
            x = seen["x"].reshape(-1, block.hidden_dim)
            logits = block.router(x)[1]
            top = torch.topk(logits, k, dim=-1).indices
            for e in range(E):
                hit = (top == e).any(-1)
                want = torch.full((I,), float("nan"))
                if hit.any():
                    xs = torch.sigmoid(logits[hit, e : e + 1]) * x[hit]
                    gate, up = (xs @ block.experts.gate_up_proj[e]).chunk(2, dim=-1)
                    want = (up * block.experts.act_fn(gate)).mean(0)
                np.testing.assert_allclose(
                    pooled[n, layer, e * I : (e + 1) * I].numpy(), want.numpy(), rtol=1e-5, atol=1e-6
                )
                assert share[n, layer, e].item() == pytest.approx(hit.float().mean().item())
    handle.remove()
    assert torch.isnan(share[:, 0]).all() and torch.isnan(share[:, 2]).all()  # dense layers route nothing


def test_a_dense_layer_among_experts_is_captured_at_its_down_proj(tiny):
    """DeepSeek's first dense layer: its neurons are columns 0..I-1 (the mean of its down_proj input
    over the prompt's tokens), the columns past its width have no neuron (NaN)."""
    model = load_fp32(tiny("deepseek_v3"))
    texts = ["The nurse said that", "A man"]
    pooled, _ = _pooled(model, texts)
    I, tok = model.config.intermediate_size, char_tokenizer(bos=True)
    seen = {}
    handle = model.model.layers[0].mlp.down_proj.register_forward_pre_hook(lambda m, a: seen.__setitem__("h", a[0]))
    for n, text in enumerate(texts):
        with torch.no_grad():
            model(input_ids=tok(text, return_tensors="pt").input_ids)
        np.testing.assert_allclose(pooled[n, 0, :I].numpy(), seen["h"][0].mean(0).numpy(), rtol=1e-5, atol=1e-6)
    handle.remove()
    assert torch.isnan(pooled[:, 0, I:]).all() and not torch.isnan(pooled[:, 1]).all()
