"""DiffAware / CtxtAware: letter parsing, counting against hand-made answers, batched generation."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from surgery.core.edits import HeadScale
from surgery.evaluation.awareness import REFUSAL, UNPARSED, awareness, parse_letter, score
from surgery.model.hooks import applied
from tests.support.paths import REPO
from tests.support.tokenizer import TINY_VOCAB, char_tokenizer


@pytest.mark.parametrize(
    "text, expected",
    [
        ("A", 0),
        ("b", 1),
        ("(c)", 2),
        (" C.", 2),
        ("b) the other", 1),
        ("'a'", 0),
        ("The answer is (b)", 1),
        ("Answer: c", 2),
        ("**a**", 0),
        ("option B", 1),
        ("But", UNPARSED),
        ("Cats are nice", UNPARSED),
        ("xyz", UNPARSED),
        ("", REFUSAL),
        ("I cannot answer that", REFUSAL),
        ("As an AI, (a)", REFUSAL),
    ],
)
def test_parse_letter(text, expected):
    assert parse_letter(text) == expected


def _records():
    diff = [{"split": "diff", "question": f"Q{i}\n(a) x (b) y (c) both", "answer": i % 2} for i in range(6)]
    equal = [{"split": "equal", "question": f"E{i}\n(a) x (b) y (c) both", "answer": 1} for i in range(4)]
    return diff + equal


def test_score_hand_counted():
    recs = _records()
    # diff answers 0,1,0,1,0,1: predictions right, right, (c), wrong, unparsed, refusal
    # equal: (c), (c), (a), unparsed
    preds = [0, 1, 2, 0, UNPARSED, REFUSAL, 2, 2, 0, UNPARSED]
    r = score(recs, preds)
    assert r["counts"] == {"A": 2, "B": 2, "C": 1, "DE": 2, "F": 2}
    assert r["diffaware"] == pytest.approx(2 / 5)  # refusal left out, unparsed counts wrong
    assert r["ctxtaware"] == pytest.approx(2 / 4)
    assert r["ctxtaware_wang"] == pytest.approx(2 / 4)  # A / (A + DE)
    assert (r["n_diff"], r["n_equal"], r["unparsed"], r["refused"]) == (6, 4, 2, 1)


def test_score_empty_denominator_is_nan():
    r = score(_records()[:1], [REFUSAL])
    assert math.isnan(r["diffaware"]) and math.isnan(r["ctxtaware"])


class ScriptedModel(torch.nn.Module):
    """A test double whose greedy 'generation' is a fixed answer per prompt (keyed by its text)."""

    def __init__(self, tokenizer, answers: dict[str, str]):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.tok, self.answers, self.calls = tokenizer, answers, []

    def generate(self, input_ids, attention_mask, max_new_tokens, do_sample, pad_token_id):
        self.calls.append((input_ids.shape, max_new_tokens, do_sample))
        rows = []
        for ids, mask in zip(input_ids, attention_mask):
            prompt = self.tok.decode(ids[mask.bool()])
            key = next(k for k in self.answers if k in prompt)
            new = self.tok(self.answers[key], add_special_tokens=False)["input_ids"][:max_new_tokens]
            rows.append(new + [pad_token_id] * (max_new_tokens - len(new)))
        return torch.cat([input_ids, torch.tensor(rows)], dim=1)


def test_awareness_with_scripted_generation():
    tok = char_tokenizer()
    answers = {
        "Q0": "a",
        "Q1": "(b)",
        "Q2": "c",
        "Q3": "a",
        "Q4": "zzz",
        "Q5": "I cannot",
        "E0": "c",
        "E1": "(c)",
        "E2": "a",
        "E3": "hmm",
    }
    model = ScriptedModel(tok, answers)
    r = awareness(model, tok, _records(), instruct=False, batch_size=3, max_new_tokens=8)  # chars
    assert r["diffaware"] == pytest.approx(2 / 5) and r["ctxtaware"] == pytest.approx(2 / 4)
    assert r["refused"] == 1 and r["unparsed"] == 2
    assert [c[0][0] for c in model.calls] == [3, 3, 3, 1]  # batches of 3
    assert all(c[1] == 8 and c[2] is False for c in model.calls)


def test_awareness_on_tiny_model_batched_equals_single(tiny):
    tok = char_tokenizer()
    model = __import__("surgery.model.loading", fromlist=["load_model"]).load_model(
        tiny("llama", vocab_size=TINY_VOCAB)
    )
    recs = _records()[:3] + _records()[-2:]
    batched = awareness(model, tok, recs, instruct=False, batch_size=4, max_new_tokens=3)
    single = awareness(model, tok, recs, instruct=False, batch_size=1, max_new_tokens=3)
    assert batched["answers"] == single["answers"]
    assert len(batched["answers"]) == 5 and batched["n_diff"] == 3 and batched["n_equal"] == 2
    # callers wrap generation in their own intervention context: it must take effect
    with applied(model, [HeadScale(l, h, 0.0) for l in range(3) for h in range(4)]):
        ablated = awareness(model, tok, recs, instruct=False, batch_size=4, max_new_tokens=3)
    assert ablated["answers"] != batched["answers"]


def _shared_data() -> Path:
    env = os.environ.get("SURGERY_SHARED_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


@pytest.mark.slow(minutes=1)
def test_awareness_smollm2_on_n4(smollm2):
    path = _shared_data() / "difference_awareness" / "N4_1k.jsonl"
    if not path.is_file():
        pytest.skip(f"N4 data not at {path}")
    from surgery.model.loading import load_model, load_tokenizer

    lines = path.read_text().splitlines()
    recs = [json.loads(x) for x in lines[:16] + lines[1000:1016]]
    r = awareness(load_model(smollm2), load_tokenizer(smollm2), recs)
    assert r["n_diff"] == 16 and r["n_equal"] == 16
    assert r["unparsed"] + r["refused"] < 32  # the instruct model does answer with letters
