"""evaluation.greedy: a batch whose finished rows leave it answers with the full batch's tokens."""

from __future__ import annotations

import pytest
import torch

from surgery.core.prompts import formatted
from surgery.evaluation.greedy import MIN_ROWS, _kept, greedy_answers, plain_greedy
from surgery.model.loading import load_model, load_tokenizer
from surgery.model.shared_prefix import layout, prefix_cache

NEW_TOKENS = 12


def test_a_batch_keeps_its_live_rows_and_never_fewer_than_min_rows():
    rows = list(range(8))
    assert _kept(rows, set(rows)) == rows
    assert _kept(rows, {1, 5, 6, 7, 0}) == [0, 1, 5, 6, 7]
    assert len(_kept(rows, {6})) == MIN_ROWS and 6 in [rows[i] for i in _kept(rows, {6})]
    assert _kept([2, 5], {5}) == [0, 1]  # a batch smaller than MIN_ROWS keeps its shape


def test_a_generation_config_with_a_logits_processor_is_not_plain_greedy(tiny):
    model = load_model(tiny("llama", num_hidden_layers=2))
    assert plain_greedy(model)
    model.generation_config.repetition_penalty = 1.3
    assert not plain_greedy(model)


def _compare(model, rows, pad, stops):
    """greedy_answers with row i done after stops[i] tokens against ``generate``'s full batch."""
    lay = layout(rows, pad)
    with torch.inference_mode():
        full = model.generate(
            input_ids=lay.ids,
            attention_mask=lay.mask,
            cache=prefix_cache(model, lay, "k"),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=pad,
        )[:, lay.ids.shape[1] :].tolist()
        fast = greedy_answers(model, lay, prefix_cache(model, lay, "k"), NEW_TOKENS, lambda r, t: len(t) >= stops[r])
    eos = model.generation_config.eos_token_id
    for row, answer in enumerate(fast):
        expected = full[row][: stops[row]]
        if eos in expected:
            expected = expected[: expected.index(eos) + 1]
        assert answer == expected, row


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])  # gemma3: sliding-window cache layers
def test_rows_leaving_the_batch_keep_the_full_batchs_tokens_on_a_tiny_model(tiny, arch):
    torch.set_num_threads(1)
    model = load_model(tiny(arch, num_hidden_layers=4))
    model.generation_config.eos_token_id = None
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, 90, (7,), generator=gen).tolist()
    rows = [prefix + torch.randint(3, 90, (n,), generator=gen).tolist() for n in (5, 8, 3, 6, 4, 7, 2, 5)]
    _compare(model, rows, 0, [1, 2, 3, 5, 8, NEW_TOKENS, NEW_TOKENS, NEW_TOKENS])


@pytest.mark.slow(minutes=1)
def test_rows_leaving_the_batch_keep_the_full_batchs_tokens_on_smollm2(smollm2):
    torch.set_num_threads(1)
    tokenizer, model = load_tokenizer(smollm2), load_model(smollm2)
    path = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "directions" / "es_questions.txt"
    questions = [q.strip() for q in path.read_text(encoding="utf-8").splitlines() if q.strip()][:8]
    texts, special = formatted(tokenizer, tuple(questions), "auto")
    rows = [tokenizer(t, add_special_tokens=special)["input_ids"] for t in texts]
    _compare(model, rows, tokenizer.eos_token_id, [1, 2, 3, 4, 6, NEW_TOKENS, NEW_TOKENS, NEW_TOKENS])
