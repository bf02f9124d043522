"""model.shared_prefix: a batch's shared prefix computed once gives the left-padded batch's greedy
answers and next-token distributions (up to summation order), and replays below an edit bit for bit.
On SmolLM2, a direction trial measures the marker hits and the first-token KL of the plain
left-padded computation (no shared prefix, no replay)."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest
import torch

from surgery.core.direction_edit import DirectionEdit
from surgery.core.edits import HeadScale
from surgery.core.prompts import formatted
from surgery.evaluation.prefill import Prefills, lowest_layer
from surgery.model.hooks import applied, decoder_layers
from surgery.model.loading import load_model
from surgery.model.shared_prefix import (
    SharedPrefix,
    common_prefix,
    layout,
    next_token_logprobs,
    prefix_cache,
    shared_layout,
)

PAD = 0
NEW_TOKENS = 6


def test_the_layout_puts_the_shared_prefix_first_and_each_rows_own_tokens_right_aligned():
    lay = layout([[5, 6, 7, 8], [5, 6, 9], [5, 6, 7, 3, 4]], PAD)
    assert lay.shared == 2
    assert lay.ids.tolist() == [[5, 6, 0, 7, 8], [5, 6, 0, 0, 9], [5, 6, 7, 3, 4]]
    assert lay.mask.tolist() == [[1, 1, 0, 1, 1], [1, 1, 0, 0, 1], [1, 1, 1, 1, 1]]
    assert lay.positions().tolist() == [[0, 1, 0, 2, 3], [0, 1, 0, 0, 2], [0, 1, 2, 3, 4]]
    # a row that is the others' prefix keeps its last token as its own (the pass needs a last position)
    assert layout([[5, 6], [5, 6, 7]], PAD).shared == 1
    # one row, rows sharing nothing, or no sharing asked: the left-padded batch
    for lay in (layout([[5, 6, 7]], PAD), layout([[5, 6], [4, 6, 7]], PAD), layout([[5, 6], [5, 6, 7]], PAD, False)):
        assert lay.shared == 0
    assert layout([[5, 6], [4, 6, 7]], PAD).ids.tolist() == [[0, 5, 6], [4, 6, 7]]


def _rows() -> list[list[int]]:
    """Three rows of random tokens after the same 7 (3 to 8 tokens of their own)."""
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, 90, (7,), generator=gen).tolist()
    return [prefix + torch.randint(3, 90, (n,), generator=gen).tolist() for n in (5, 8, 3)]


def _generate(model, lay, cache=None, around=None):
    """Greedy tokens and every step's logits of ``lay`` (``cache``: its prefix's)."""
    with torch.inference_mode(), around if around is not None else nullcontext():
        out = model.generate(
            input_ids=lay.ids,
            attention_mask=lay.mask,
            cache=cache,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=PAD,
            return_dict_in_generate=True,
            output_logits=True,
        )
    return out.sequences[:, lay.ids.shape[1] :], torch.stack(out.logits)


def test_a_shared_prefix_gives_the_left_padded_answers_and_distributions(tiny):
    torch.set_num_threads(1)
    model = load_model(tiny("llama", num_hidden_layers=4))
    rows = _rows()
    padded, shared = layout(rows, PAD, share=False), layout(rows, PAD)
    assert shared.shared == 7 and padded.shared == 0
    tokens, logits = _generate(model, padded)
    fast_tokens, fast_logits = _generate(model, shared, prefix_cache(model, shared, "k"))
    assert torch.equal(fast_tokens, tokens)
    torch.testing.assert_close(fast_logits, logits, rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        plain = model(input_ids=padded.ids, attention_mask=padded.mask, position_ids=padded.positions())
    expected = plain.logits[:, -1].float().log_softmax(-1)
    torch.testing.assert_close(next_token_logprobs(model, rows, PAD, "k"), expected, rtol=1e-5, atol=1e-5)


def test_a_model_with_sliding_window_layers_gets_the_left_padded_batch(tiny):
    torch.set_num_threads(1)
    model = load_model(tiny("gemma3_text", num_hidden_layers=4))
    rows = _rows()
    assert shared_layout(model, rows, PAD).shared == 0
    assert prefix_cache(model, layout(rows, PAD), "k") is None
    padded = layout(rows, PAD, share=False)
    with torch.inference_mode():
        plain = model(input_ids=padded.ids, attention_mask=padded.mask, position_ids=padded.positions())
    expected = plain.logits[:, -1].float().log_softmax(-1)
    torch.testing.assert_close(next_token_logprobs(model, rows, PAD, "k"), expected, rtol=1e-5, atol=1e-5)


def test_batches_sharing_one_prefix_pass_get_what_their_own_pass_of_it_gives(tiny):
    torch.set_num_threads(1)
    model = load_model(tiny("llama", num_hidden_layers=4))
    first = _rows()
    gen = torch.Generator().manual_seed(1)
    # a second batch holding the first's 7 tokens and 2 more of its own in common
    second = [first[0][:9] + torch.randint(3, 90, (n,), generator=gen).tolist() for n in (4, 6, 2)]
    tokens = tuple(first[0][: common_prefix([*first, *second])])
    assert len(tokens) == 7 and common_prefix(second) == 9
    held = SharedPrefix(tokens)
    next_token_logprobs(model, first, PAD, "a", prefix=held)
    assert held.layers is not None and held.layers[0].keys.shape[0] == 1  # the one-row pass, kept
    reused = next_token_logprobs(model, second, PAD, "b", prefix=held)
    own = next_token_logprobs(model, second, PAD, "b", prefix=SharedPrefix(tokens))  # runs the pass itself
    assert torch.equal(reused, own)
    assert shared_layout(model, second, PAD, held).shared == 7  # never longer than the held prefix
    torch.testing.assert_close(reused, next_token_logprobs(model, second, PAD, "b"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer", [0, 2])
def test_an_edit_replays_the_unedited_shared_prefix_and_rows_bit_for_bit(tiny, layer):
    torch.set_num_threads(1)
    model = load_model(tiny("llama", num_hidden_layers=4))
    rows, prefills = _rows(), Prefills()
    lay = layout(rows, PAD)
    record = lambda key: prefills.recording(model, key)  # noqa: E731
    next_token_logprobs(model, rows, PAD, "kl", record)
    _generate(model, lay, prefix_cache(model, lay, "answers", record), record("answers"))
    assert {"kl", ("prefix", "kl"), "answers", ("prefix", "answers")} <= set(prefills.batches)
    edits = [HeadScale(layer, 1, 0.0), HeadScale(3, 0, 1.5)]
    below = lowest_layer(model, edits)
    replay = lambda key: prefills.replaying(model, key, below)  # noqa: E731
    calls = [0]
    with applied(model, edits):
        full_kl = next_token_logprobs(model, rows, PAD, "kl")
        full = _generate(model, lay, prefix_cache(model, lay, "answers"))
        hook = decoder_layers(model)[0].mlp.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        fast_kl = next_token_logprobs(model, rows, PAD, "kl", replay)
        fast = _generate(model, lay, prefix_cache(model, lay, "answers", replay), replay("answers"))
        hook.remove()
    assert torch.equal(fast_kl, full_kl)
    assert torch.equal(fast[0], full[0]) and torch.equal(fast[1], full[1])
    # above layer 0, layer 0 runs for the decode steps alone: never for a prefix or a prefill
    assert calls[0] == NEW_TOKENS - 1 + (0 if layer > 0 else 4)  # 4: two prefixes, two prefills


DIRECTIONS = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "directions"


def _lines(name: str, n: int) -> list[str]:
    text = (DIRECTIONS / name).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()][:n]


def _plain(model, tokenizer, prompts, neutral, wanted, edits) -> tuple[np.ndarray, torch.Tensor]:
    """Marker hits of whole left-padded greedy answers and left-padded next-token log-softmax: the
    computation before shared prefixes, replays and marker stops."""
    out = []
    for texts in (prompts, neutral):
        chat, special = formatted(tokenizer, tuple(texts), "auto")
        enc = tokenizer(chat, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=special)
        out.append(enc)
    with torch.inference_mode(), applied(model, edits):
        ids = model.generate(**out[0], max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        logits = model(**out[1]).logits[:, -1].float().log_softmax(-1)
    answers = tokenizer.batch_decode(ids[:, out[0]["input_ids"].shape[1] :], skip_special_tokens=True)
    return np.array([any(m in a.lower() for m in wanted) for a in answers]), logits


@pytest.mark.slow(minutes=2)
def test_a_direction_trial_measures_the_plain_hits_and_kl_on_smollm2(smollm2):
    from surgery.find.tune.direction import DirectionTrials
    from surgery.find.tune.params import TuneParams
    from surgery.find.tune.runtime import first_token_kl
    from surgery.model.loading import load_tokenizer

    torch.set_num_threads(1)
    tokenizer, model = load_tokenizer(smollm2), load_model(smollm2)
    prompts, neutral = _lines("es_questions.txt", 8), _lines("en_questions.txt", 8)
    wanted = [m.lower() for m in _lines("spanish_letters.txt", 99)]
    params = TuneParams(method="direction", max_new_tokens=16, batch_size=8)
    trials = DirectionTrials(model, tokenizer, prompts, neutral, params, wanted)
    base_hits, base_logprobs = _plain(model, tokenizer, prompts, neutral, wanted, [])
    assert trials.base.tolist() == base_hits.tolist() and 0 < base_hits.sum() < len(prompts)
    unit = np.random.default_rng(0).standard_normal(model.config.hidden_size).astype(np.float32)
    unit = (unit / np.linalg.norm(unit)).tobytes()
    for first, weight in ((0, 6.0), (12, 8.0), (27, 20.0)):  # an edit from the embeddings' layer, mid, top
        edits = [
            DirectionEdit(module=m, vector="r.safetensors#r", weight=weight, layer=layer, unit=unit)
            for layer in range(first, model.config.num_hidden_layers)
            for m in ("attention", "mlp")
        ]
        hits, kl = trials.measure(edits)
        plain_hits, plain_logprobs = _plain(model, tokenizer, prompts, neutral, wanted, edits)
        plain_kl = first_token_kl(base_logprobs, plain_logprobs)
        assert hits.tolist() == plain_hits.tolist()
        np.testing.assert_allclose(kl, plain_kl, rtol=1e-4, atol=1e-6)
        assert kl.mean() > 1e-3  # the edit changes the distributions
