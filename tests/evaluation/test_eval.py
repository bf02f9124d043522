"""Evaluation numbers against hand-computed references: perplexity, option log-likelihoods, KL, BBQ."""

from __future__ import annotations

import math
import re
import sys
from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache

from surgery.core.errors import SurgeryError
from surgery.core.optional import pip_install
from surgery.evaluation import bbq as evaluate_bbq
from surgery.evaluation import lm
from surgery.evaluation.data import subsample
from surgery.evaluation.suites import make_plan
from surgery.model.loading import load_model
from tests.support.tokenizer import TINY_VOCAB, char_tokenizer

V = 50


class ConstantLM(torch.nn.Module):
    """Logits that ignore the input: ``favoured`` token gets ``boost``, every other token 0."""

    def __init__(self, favoured: int | None = None, boost: float = 0.0, vocab: int = V):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(max_position_embeddings=64)
        self.favoured, self.boost, self.vocab = favoured, boost, vocab

    def forward(self, input_ids, attention_mask=None, logits_to_keep=0, cache=None, use_cache=False):
        logits = torch.zeros(*input_ids.shape, self.vocab)[:, -logits_to_keep:]
        if self.favoured is not None:
            logits[..., self.favoured] = self.boost
        # the context's key/value cache, as option_logliks uses it (nothing to hold: the logits ignore the input)
        return SimpleNamespace(logits=logits, cache=DynamicCache() if use_cache else None)


class IdTokenizer:
    """Characters a..z → ids 1..26; pad id 0; no special tokens."""

    pad_token_id = 0

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) - ord("a") + 1 for c in text]}


def test_uniform_model_perplexity_is_vocab_size():
    r = lm.perplexity(ConstantLM(), IdTokenizer(), ["abcdefg", "hij", "klmnopqrstu"], batch_size=2)
    assert r["perplexity"] == pytest.approx(V, rel=1e-6)
    assert r["tokens"] == 6 + 2 + 10  # the first token of each text is context only


def test_option_loglik_counts_exactly_the_continuation_tokens():
    boost = 3.0
    model = ConstantLM(favoured=1, boost=boost)  # token 1 is "a"
    z = math.exp(boost) + V - 1
    log_a, log_other = boost - math.log(z), -math.log(z)
    ll = lm.option_logliks(model, IdTokenizer(), [("xyz", "ab"), ("q", "bbb"), ("zz", "a")], batch_size=2)
    assert ll == pytest.approx([log_a + log_other, 3 * log_other, log_a], rel=1e-6)


def test_choose_normalises_by_option_length():
    # raw sums favour the short option; per character the long one wins
    assert lm.choose([-3.0, -4.0], [" ab", " abcdefgh"], normalize=False) == 0
    assert lm.choose([-3.0, -4.0], [" ab", " abcdefgh"], normalize=True) == 1


@pytest.fixture
def tiny_lm(tiny):
    def make(**kw):
        return load_model(tiny("llama", vocab_size=TINY_VOCAB, **kw))

    return make


def test_perplexity_batched_equals_direct_loop(tiny_lm):
    model, tok = tiny_lm(), char_tokenizer()
    texts = ["The river runs to the sea.", "Bread rises.", "A longer sentence about clocks and bells."]
    nll, n = 0.0, 0
    for t in texts:
        ids = torch.tensor([tok(t)["input_ids"]])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), -1)
        nll -= float(logp.gather(-1, ids[0, 1:, None]).sum())
        n += ids.shape[1] - 1
    r = lm.perplexity(model, tok, texts, batch_size=3)
    assert r["perplexity"] == pytest.approx(math.exp(nll / n), rel=1e-5) and r["tokens"] == n


def test_kl_zero_for_identical_models_positive_after_an_edit(tiny_lm):
    from surgery.core.edits import HeadScale
    from surgery.model.hooks import applied

    tok = char_tokenizer()
    a, b = tiny_lm(), tiny_lm()  # same seed: identical weights
    prompts = ["The capital of France is", "Once upon a time"]
    ref = lm.next_token_logprobs(a, tok, prompts)
    same = lm.kl_divergence(ref, lm.next_token_logprobs(b, tok, prompts))
    assert same["kl_mean"] == 0.0 and same["top1_agreement"] == 1.0
    with applied(b, [HeadScale(0, 1, 3.0)]):
        edited = lm.next_token_logprobs(b, tok, prompts)
    r = lm.kl_divergence(ref, edited)
    p, q = ref[0][-1], edited[0][-1]
    hand = float((p.exp() * (p - q)).sum())
    assert r["kl_mean"] > 0 and r["kl_max"] >= hand - 1e-7 and r["positions"] == sum(len(x) for x in prompts)


def _bbq_item(cond, polarity, label, target_idx, category="Age"):
    groups = ["unknown", "old", "nonOld"]
    if target_idx == 2:
        groups = ["unknown", "nonOld", "old"]
    info = {
        f"ans{i}": [
            ["Unknown", "grandfather", "grandson"][i] if target_idx == 1 else ["Unknown", "grandson", "grandfather"][i],
            groups[i],
        ]
        for i in range(3)
    }
    return {
        "context": "c",
        "question": "q",
        "ans0": "Unknown",
        "ans1": "x",
        "ans2": "y",
        "label": label,
        "answer_info": info,
        "question_polarity": polarity,
        "context_condition": cond,
        "category": category,
        "additional_metadata": {"stereotyped_groups": ["old"]},
    }


def test_bbq_scores_on_hand_made_items():
    items = [
        # ambiguous: correct = 0 (unknown)
        _bbq_item("ambig", "neg", 0, 1),  # pred 1 = target on a neg question → biased
        _bbq_item("ambig", "nonneg", 0, 1),  # pred 2 = other on a nonneg question → biased
        _bbq_item("ambig", "neg", 0, 2),  # pred 0 = unknown → correct
        _bbq_item("ambig", "neg", 0, 2),  # pred 1 = other on a neg question → anti-stereotyped
        # disambiguated
        _bbq_item("disambig", "neg", 1, 1),  # pred 1: correct, target on neg → biased
        _bbq_item("disambig", "neg", 2, 1),  # pred 1: wrong, target on neg → biased
        _bbq_item("disambig", "nonneg", 1, 1, "Religion"),  # pred 1: correct, target on nonneg → anti
    ]
    preds = [1, 2, 0, 1, 1, 1, 1]
    r = evaluate_bbq.score(items, preds)
    assert r["acc_ambig"] == pytest.approx(1 / 4)
    assert r["bias_ambig"] == pytest.approx((1 - 1 / 4) * (2 * 2 / 3 - 1))  # 2 biased of 3 non-unknown
    assert r["acc_disambig"] == pytest.approx(2 / 3)
    assert r["bias_disambig"] == pytest.approx(2 * 2 / 3 - 1)
    assert r["categories"]["Religion"]["bias_disambig"] == pytest.approx(-1.0)
    assert r["unresolved"] == 0


def test_bbq_roles_match_group_names_and_labels():
    item = _bbq_item("ambig", "neg", 0, 2)
    assert evaluate_bbq.roles(item) == {"unknown": 0, "target": 2, "other": 1}
    item["additional_metadata"]["stereotyped_groups"] = ["grandfather"]  # by name, not group label
    assert evaluate_bbq.roles(item)["target"] == 2
    item["additional_metadata"]["stereotyped_groups"] = ["nobody"]
    assert evaluate_bbq.roles(item) is None


def test_subsample_is_fixed_and_ordered():
    a = subsample(list(range(100)), 10)
    assert a == subsample(list(range(100)), 10) and a == sorted(a) and len(a) == 10


def test_plan_errors_name_the_missing_input(monkeypatch):
    with pytest.raises(SurgeryError, match="--suite bbq needs --bbq"):
        make_plan(["bbq"], against=False)
    with pytest.raises(SurgeryError, match="--suite kl needs --against"):
        make_plan(["kl"], against=False)
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # importing it now fails: the package is absent
    with pytest.raises(SurgeryError, match=re.escape(pip_install("lmeval"))):
        make_plan(None, against=False, lm_eval_tasks=["arc_easy"])
    assert make_plan(None, against=True, limit=2).suites == ("retention", "kl")
