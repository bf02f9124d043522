"""The attribution-patching screen's pass (atp.py): each head's ∂S/∂e is the derivative of S along
the edge scale α at α = 1, the exact knockout's effect to first order; the pass leaves S and the
features as they were; one backward serves every prompt of a batch; its FLOPs are counted."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from surgery.find.heads.attention import EdgeEdit, edge_heads, surgery_attention_on
from surgery.find.heads.benchmark import load_benchmark
from surgery.find.heads.flops import Counter
from surgery.find.heads.pairs import build_pairs
from surgery.find.heads.scores import encode_pairs, option_token_ids, run_prompts
from surgery.model.loading import load_model, load_tokenizer
from tests.support.binding import CHAT, char_model, write_small_benchmark
from tests.support.paths import FIXTURES
from tests.support.tokenizer import char_tokenizer

EPS = 1e-3  # the edge-scale step of the central difference
BATCH = 3


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("bind")
    return build_pairs(load_benchmark(write_small_benchmark(root / "small.jsonl")), seed=0, max_pairs=4)


def _s(model, prompts, ids, head: tuple[int, int], alpha: float) -> np.ndarray:
    return run_prompts(model, prompts, ids, batch_size=BATCH, edit=EdgeEdit(edge_heads([head]), alpha)).s


def test_attribution_is_the_derivative_along_the_edge_scale():
    """On the planted circuit (large, non-linear knockout effects), each of the strongest heads'
    attribution equals the central difference of S at α = 1 ± EPS (α = 1 − e)."""
    torch.set_num_threads(1)
    fixture = FIXTURES / "binding_model"
    pairs = build_pairs(load_benchmark(fixture / "benchmark.jsonl"), seed=0, max_pairs=8)
    model, tok = load_model(fixture), load_tokenizer(fixture)
    prompts, ids = encode_pairs(tok, pairs, "binding", None), option_token_ids(tok)
    with surgery_attention_on(model):
        screened = run_prompts(model, prompts, ids, batch_size=BATCH, features=True, screen=True).screen
        strength = np.abs(screened).mean(0)
        top = np.argsort(-strength.ravel())[:3]
        for layer, head in zip(*np.unravel_index(top, strength.shape)):
            h = (int(layer), int(head))
            slope = (_s(model, prompts, ids, h, 1 - EPS) - _s(model, prompts, ids, h, 1 + EPS)) / (2 * EPS)
            assert np.abs(slope).max() > 0.5  # a circuit head: S moves
            np.testing.assert_allclose(screened[:, layer, head], slope, atol=2e-3 * np.abs(slope).max(), rtol=0)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "qwen2"])
def test_attribution_equals_the_exact_knockout_where_it_is_linear(tiny, small, arch):
    """On tiny random models (diffuse attention: a knockout moves S linearly) the screened S_ko,
    S + ∂S/∂e, is the exact knockout's S; Gemma-2 soft-caps, Qwen-2 groups its keys and values."""
    path = char_model(tiny, arch, CHAT)
    model, tok = load_model(path), char_tokenizer(CHAT)
    prompts, ids = encode_pairs(tok, small, "binding", True), option_token_ids(tok)
    n_layers = model.config.get_text_config().num_hidden_layers
    with surgery_attention_on(model):
        res = run_prompts(model, prompts, ids, batch_size=BATCH, features=True, screen=True)
        moved = 0.0
        for head in [(0, 1), (1, 0), (n_layers - 1, 2)]:
            exact = _s(model, prompts, ids, head, 0.0) - res.s
            np.testing.assert_allclose(res.screen[:, head[0], head[1]], exact, atol=5e-6, rtol=0.05)
            moved = max(moved, float(np.abs(exact).max()))
    assert moved > 1e-5  # some knockout does change S


def test_the_screen_leaves_scores_and_features_as_they_were(tiny, small):
    """The screened pass gives the plain features pass's S and features bit for bit (they come from its
    pass without gradients; the pass with gradients resumes from it), and leaves the weights as it found
    them: no gradient kept, requires_grad restored."""
    path = char_model(tiny, "llama", CHAT)
    model, tok = load_model(path), char_tokenizer(CHAT)
    model.requires_grad_(True)
    prompts, ids = encode_pairs(tok, small, "binding", True), option_token_ids(tok)
    with surgery_attention_on(model):
        plain = run_prompts(model, prompts, ids, batch_size=BATCH, features=True)
        screened = run_prompts(model, prompts, ids, batch_size=BATCH, features=True, screen=True)
    np.testing.assert_array_equal(screened.s, plain.s)
    np.testing.assert_array_equal(screened.features, plain.features)
    assert plain.screen is None and screened.screen.shape == plain.features.shape
    assert all(p.requires_grad and p.grad is None for p in model.parameters())


def test_one_backward_serves_every_prompt_of_a_batch(tiny, small):
    """Prompts in a batch are independent: batches of 1 and of 3 give the same attributions."""
    path = char_model(tiny, "llama", CHAT)
    model, tok = load_model(path), char_tokenizer(CHAT)
    prompts, ids = encode_pairs(tok, small, "binding", True), option_token_ids(tok)
    with surgery_attention_on(model):
        one = run_prompts(model, prompts, ids, batch_size=1, screen=True).screen
        three = run_prompts(model, prompts, ids, batch_size=3, screen=True).screen
    assert np.abs(three).max() > 0
    np.testing.assert_allclose(one, three, atol=1e-6 * np.abs(three).max(), rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_backward_flops_bound_what_torch_counts(tiny, small, arch):
    """Counter.screen_forward + Counter.backward against torch's FlopCounterMode (the screened pass minus
    the plain one: the forward with gradients from the first tested token and its backward): at least
    what they dispatch, above it by less than one layer's linear maps."""
    path = char_model(tiny, arch, CHAT)
    model, tok = load_model(path), char_tokenizer(CHAT)
    prompts, ids = encode_pairs(tok, small, "binding", True), option_token_ids(tok)
    with surgery_attention_on(model):
        with FlopCounterMode(display=False) as screened:
            run_prompts(model, prompts, ids, batch_size=BATCH, features=True, screen=True)
        with FlopCounterMode(display=False) as plain:
            run_prompts(model, prompts, ids, batch_size=BATCH, features=True)
    measured = screened.get_total_flops() - plain.get_total_flops()
    counter = Counter.of(model)
    one_layer = counter.full(prompts, BATCH) // counter.layers  # a layer's share of a pass, attention included
    counted = counter.screen_forward(prompts, BATCH) + counter.backward(prompts, BATCH)
    assert measured <= counted <= measured + one_layer
    assert counter.screen_forward(prompts, BATCH) < counter.full(prompts, BATCH)  # resumed: fewer positions
