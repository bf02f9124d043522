"""Plain scoring with each batch's common prefix run once (shared_prefix.py): the S of one full
pass per prompt, on tiny models of every architecture, sliding windows shorter than the prompts
included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from surgery.find.heads.attention import surgery_attention_on
from surgery.find.heads.benchmark import load_benchmark
from surgery.find.heads.pairs import build_pairs
from surgery.find.heads.scores import encode_pairs, option_token_ids, run_prompts, s_scores
from surgery.find.heads.shared_prefix import common_prefix, token_order_groups
from surgery.model.loading import load_model
from tests.support.binding import CHAT, char_model, write_small_benchmark
from tests.support.tokenizer import char_tokenizer

ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "gemma3", "phi3", "olmo2"]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("bind")
    return build_pairs(load_benchmark(write_small_benchmark(root / "small.jsonl")), seed=0, max_pairs=4)


def one_prompt_per_pass(model, prompts, ids) -> np.ndarray:
    """The paper's way: every prompt alone, no padding, no cache."""
    out = []
    with torch.inference_mode():
        for p in prompts:
            x = torch.tensor([p.ids])
            logits = model(input_ids=x, attention_mask=torch.ones_like(x), use_cache=False).logits[:, -1]
            out.append(float(s_scores(logits.float().log_softmax(-1), ids)[0]))
    return np.array(out)


@pytest.mark.parametrize("arch", ARCHS)
def test_shared_prefix_scores_equal_one_prompt_per_pass(tiny, small, arch):
    path = char_model(tiny, arch, CHAT)  # chat prompts: a long common prefix
    model, tok = load_model(path), char_tokenizer(CHAT)
    prompts = encode_pairs(tok, small, "binding", True) + encode_pairs(tok, small, "knowledge", True)
    ids = option_token_ids(tok)
    groups = token_order_groups(prompts, 3)
    assert min(common_prefix([prompts[i].ids for i in g]) for g in groups) > 8  # longer than the windows
    with surgery_attention_on(model):
        shared = run_prompts(model, prompts, ids, batch_size=3).s
        padded = run_prompts(model, prompts, ids, batch_size=3, share_prefixes=False).s
    alone = one_prompt_per_pass(model, prompts, ids)
    assert np.abs(shared - alone).max() <= 1e-5 and np.abs(padded - alone).max() <= 1e-5
    window = getattr(model.config.get_text_config(), "sliding_window", None)
    if window:  # the mask keeps the window counted from the prefix's first token
        assert window < max(len(p.ids) for p in prompts), "the tiny config's window must be exercised"


def test_common_prefix_leaves_every_row_a_token():
    assert common_prefix([(1, 2, 3), (1, 2, 3)]) == 2
    assert common_prefix([(1, 2, 3, 4), (1, 2, 5)]) == 2
    assert common_prefix([(7,), (7, 8)]) == 0
    assert common_prefix([(1, 2), (3, 4)]) == 0


def test_flop_count_of_shared_prefix_passes(tiny, small):
    """find-heads prints the FLOPs before it starts: the shared passes count fewer than full ones,
    and exactly one prefix row plus the tails when a batch is one prompt repeated."""
    from surgery.find.heads.resume import Counter

    path = char_model(tiny, "llama", CHAT)
    model, tok = load_model(path), char_tokenizer(CHAT)
    prompts = encode_pairs(tok, small, "knowledge", True)
    counter = Counter.of(model)
    assert counter.shared(prompts, 3) < counter.full(prompts, 3)
    same = [prompts[0]] * 3
    n = len(prompts[0].ids)
    assert counter.shared(same, 3) == (
        counter.layer_flops(1, n - 1) + counter.layer_flops(3, n, n - 1) + 3 * 2 * counter.head_params
    )
