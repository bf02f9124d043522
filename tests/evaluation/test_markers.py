"""evaluation.markers: an answer ends once it holds a marker, which decides its hit. On SmolLM2 the
hits are those of the whole answers, a row without a marker gets its whole answer, and the
generation stops as soon as every row holds one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from surgery.core.prompts import formatted
from surgery.evaluation.markers import _answers, marker_hits
from surgery.model.loading import load_model, load_tokenizer

DIRECTIONS = Path(__file__).resolve().parents[2] / "examples" / "directions"
NEW_TOKENS = 16


def _lines(path: Path, n: int) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()][:n]


@pytest.fixture(scope="module")
def smollm(smollm2):
    torch.set_num_threads(1)
    return load_tokenizer(smollm2), load_model(smollm2)


def test_an_answer_ended_at_its_marker_keeps_the_whole_answers_hit(smollm):
    tokenizer, model = smollm
    prompts = _lines(DIRECTIONS / "es_questions.txt", 8)
    wanted = [m.lower() for m in _lines(DIRECTIONS / "spanish_letters.txt", 99)]
    texts, special = formatted(tokenizer, tuple(prompts), "auto")
    whole = _answers(model, tokenizer, texts, special, NEW_TOKENS)
    ended = _answers(model, tokenizer, texts, special, NEW_TOKENS, until=wanted)
    held = [any(m in answer.lower() for m in wanted) for answer in whole]
    assert any(held) and not all(held)  # both kinds of row are in the batch
    for full, short, hit in zip(whole, ended, held):
        if hit:
            assert full.startswith(short) and any(m in short.lower() for m in wanted)
        else:
            assert short == full  # the rows still answering are computed as in the whole generation
    hits = marker_hits(model, tokenizer, prompts, wanted, max_new_tokens=NEW_TOKENS, batch_size=8)
    assert hits.tolist() == held


def test_the_generation_stops_once_every_row_holds_a_marker(smollm):
    tokenizer, model = smollm
    prompts = _lines(DIRECTIONS / "en_questions.txt", 4)
    texts, special = formatted(tokenizer, tuple(prompts), "auto")
    whole = _answers(model, tokenizer, texts, special, NEW_TOKENS)
    firsts = [answer.split()[0].lower() for answer in whole]  # every answer holds its first word
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        hits = marker_hits(model, tokenizer, prompts, firsts, max_new_tokens=NEW_TOKENS, batch_size=4)
    finally:
        handle.remove()
    assert hits.all()
    assert len(calls) < NEW_TOKENS  # the prefill and fewer decode steps than the whole answers'
