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
from surgery.find.heads.shared_prefix import common_prefix, last_token_logits, token_order_groups
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


def prefix_then_tails(model, rows, pad: int) -> torch.Tensor:
    """last_token_logits with the prefix pass computing its last position's logits (that nothing
    reads): the reference its pass without lm_head work must equal bit for bit."""
    from transformers import DynamicCache

    ids = [r.ids for r in rows]
    shared = common_prefix(ids)
    tails = [row[shared:] for row in ids]
    width = max(len(t) for t in tails)
    batch = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), shared + width), dtype=torch.long)
    mask[:, :shared] = 1
    for b, tail in enumerate(tails):
        batch[b, : len(tail)] = torch.tensor(tail)
        mask[b, shared : shared + len(tail)] = 1
    cache = DynamicCache()
    prefix = torch.tensor([ids[0][:shared]])
    model(input_ids=prefix, attention_mask=torch.ones_like(prefix), cache=cache, use_cache=True, logits_to_keep=1)
    cache = DynamicCache(
        [(c.keys.expand(len(rows), -1, -1, -1), c.values.expand(len(rows), -1, -1, -1)) for c in cache.layers]
    )
    last = torch.tensor([len(t) - 1 for t in tails])
    keep = torch.unique(last)
    out = model(input_ids=batch, attention_mask=mask, cache=cache, use_cache=True, logits_to_keep=keep)
    return out.logits[torch.arange(len(rows)), torch.searchsorted(keep, last)]


@pytest.mark.parametrize("arch", ARCHS)
def test_prefix_pass_without_logits_changes_no_bit(tiny, small, arch):
    """The prefix pass computes no logits (nothing reads them): every row's logits are those of a
    prefix pass that computed its last position's, bit for bit, on every architecture."""
    path = char_model(tiny, arch, CHAT)
    model, tok = load_model(path), char_tokenizer(CHAT)
    prompts = encode_pairs(tok, small, "knowledge", True)
    counted = []
    head = model.get_output_embeddings()
    handle = head.register_forward_hook(lambda module, args, out: counted.append(args[0].shape[:-1].numel()))
    try:
        for group in token_order_groups(prompts, 3):
            rows = [prompts[i] for i in group]
            assert common_prefix([r.ids for r in rows]) > 0
            with torch.inference_mode():
                counted.clear()
                ours = last_token_logits(model, rows, 0, torch.device("cpu"))
                assert counted[0] == 0, "the prefix pass ran lm_head on a position"
                assert torch.equal(ours, prefix_then_tails(model, rows, 0))
    finally:
        handle.remove()


def test_common_prefix_leaves_every_row_a_token():
    assert common_prefix([(1, 2, 3), (1, 2, 3)]) == 2
    assert common_prefix([(1, 2, 3, 4), (1, 2, 5)]) == 2
    assert common_prefix([(7,), (7, 8)]) == 0
    assert common_prefix([(1, 2), (3, 4)]) == 0


def test_flop_count_of_shared_prefix_passes(tiny, small):
    """find-heads prints the FLOPs before it starts: the shared passes count fewer than full ones,
    and exactly one prefix row plus the tails when a batch is one prompt repeated."""
    from surgery.find.heads.flops import Counter

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
