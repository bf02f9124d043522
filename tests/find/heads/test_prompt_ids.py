"""One prompt encoder for S scoring and awareness generation: base prompts end in the "(" token.

docs/methods/binding-heads.md: the base prompt is text ending in "... I would choose letter "
followed by a "(" token. Tokenizing the text "letter (" gives " (" on BPE tokenizers — another
token. Both the S score and DiffAware/CtxtAware generation must read the ids of
binding_prompts.encode_question.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from surgery.core.mcq import BASE_ANSWER_START, INSTRUCTION, cue_token_id, encode_question, format_mcq
from surgery.evaluation.awareness import awareness
from surgery.find.heads.benchmark import question_spans
from surgery.find.heads.pairs import Question
from surgery.find.heads.scores import encode_pairs
from tests.support.binding import CHAT
from tests.support.tokenizer import SPACE_PAREN, char_tokenizer

QUESTION = "Who should avoid kilts?\n(a) the Scot (b) the Dane (c) Both"


class Recorder(torch.nn.Module):
    """A generation double that keeps the real (unpadded) token ids of every prompt it is given."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.prompts: list[list[int]] = []

    def generate(self, input_ids, attention_mask, max_new_tokens, do_sample, pad_token_id):
        self.prompts += [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask)]
        return torch.cat([input_ids, torch.full((len(input_ids), max_new_tokens), pad_token_id)], dim=1)


def _records(n: int = 3) -> list[dict]:
    return [{"split": "diff", "question": QUESTION.replace("kilts", f"kilts{i}"), "answer": 1} for i in range(n)]


def _generated_ids(tok, records, instruct: bool) -> list[list[int]]:
    model = Recorder()
    awareness(model, tok, records, instruct=instruct, batch_size=2, max_new_tokens=1)
    return model.prompts


def test_base_prompt_appends_the_paren_token_where_text_would_give_space_paren():
    tok = char_tokenizer(merges=[SPACE_PAREN])
    paren, space_paren = tok.convert_tokens_to_ids(["(", " ("])
    text_ids = tok(format_mcq(tok, QUESTION, instruct=False))["input_ids"]
    assert text_ids[-1] == space_paren  # the text form would end in another token
    enc = encode_question(tok, QUESTION, instruct=False)
    assert enc.ids[-1] == paren == cue_token_id(tok)
    assert list(enc.ids[:-1]) == tok(QUESTION + "\n\n" + INSTRUCTION + BASE_ANSWER_START)["input_ids"]


def test_awareness_generates_from_the_ids_the_s_score_reads():
    tok = char_tokenizer(merges=[SPACE_PAREN])
    records = _records()
    expected = [list(encode_question(tok, r["question"], instruct=False).ids) for r in records]
    assert _generated_ids(tok, records, instruct=False) == expected
    # the S score's prompts for the same question texts: the same encoder, the same ids
    match, mismatch = (Question(r["question"], question_spans(r["question"], None, 0)) for r in records[:2])
    scored = encode_pairs(tok, [SimpleNamespace(match=match, mismatch=mismatch)], "binding", instruct=False)
    assert [list(e.ids) for e in scored] == expected[:2]


def test_instruct_prompts_are_the_chat_template_text_unchanged():
    tok = char_tokenizer(CHAT, merges=[SPACE_PAREN])
    records = _records(2)
    # the chat template writes BOS itself: the text is tokenized without adding special tokens
    expected = [
        tok(format_mcq(tok, r["question"], instruct=True), add_special_tokens=False)["input_ids"] for r in records
    ]
    assert _generated_ids(tok, records, instruct=True) == expected
    assert expected[0][-len("assistant:") :] == tok("assistant:")["input_ids"]


@pytest.mark.slow(minutes=1)
def test_gemma3_base_prompt_ends_in_the_paren_token(gemma3_270m):
    """Gemma-3's tokenizer has both " (" and "(": scoring and generation both end in "("."""
    from surgery.model.loading import load_tokenizer

    tok = load_tokenizer(gemma3_270m)
    paren = tok.encode("(", add_special_tokens=False)
    space_paren = tok.encode(" (", add_special_tokens=False)
    assert len(paren) == len(space_paren) == 1 and paren != space_paren
    assert tok(format_mcq(tok, QUESTION, instruct=False))["input_ids"][-1] == space_paren[0]
    records = _records(2)
    generated = _generated_ids(tok, records, instruct=False)
    assert all(ids[-1] == paren[0] and ids[-2] != space_paren[0] for ids in generated)
    assert generated == [list(encode_question(tok, r["question"], instruct=False).ids) for r in records]
