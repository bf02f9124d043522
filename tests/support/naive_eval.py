"""The straightforward evaluation a user would write with transformers: one item per forward pass,
full-vocabulary log-softmax at every position. The reference the batched, cached ``surgery eval``
must reproduce (tests/evaluation/test_eval_cache.py, examples/bench_eval.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from surgery.evaluation.lm import MAX_WINDOW


def _logprobs(model, ids: list[int]) -> torch.Tensor:
    """log-softmax of the logits at every position of one unpadded sequence (fp32)."""
    with torch.inference_mode():
        return torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)


def perplexity(model, tokenizer, texts: Sequence[str]) -> float:
    """exp(mean NLL per predicted token), each text in windows of at most ``MAX_WINDOW`` tokens."""
    limit = min(MAX_WINDOW, int(getattr(model.config, "max_position_embeddings", MAX_WINDOW) or MAX_WINDOW))
    nll, count = 0.0, 0
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        for w in (ids[i : i + limit] for i in range(0, len(ids), limit)):
            if len(w) > 1:
                lp = _logprobs(model, w)[:-1].gather(-1, torch.tensor(w[1:])[:, None])[:, 0]
                nll -= float(lp.double().sum())
                count += len(w) - 1
    return math.exp(nll / count)


def option_loglik(model, tokenizer, context: str, continuation: str) -> float:
    """Sum of log p(continuation tokens | context) on the joined sequence."""
    ctx = tokenizer(context)["input_ids"]
    cont = tokenizer(continuation, add_special_tokens=False)["input_ids"]
    lp = _logprobs(model, ctx + cont)
    return float(sum(float(lp[len(ctx) - 1 + j, t]) for j, t in enumerate(cont)))


def mcq(model, tokenizer, questions: Sequence[dict[str, Any]]) -> tuple[float, list[list[float]]]:
    """Accuracy of the highest-log-likelihood option, and every option's log-likelihood."""
    scores = [
        [option_loglik(model, tokenizer, f"Question: {q['question']}\nAnswer:", f" {c}") for c in q["choices"]]
        for q in questions
    ]
    right = sum(max(range(len(s)), key=s.__getitem__) == q["answer"] for s, q in zip(scores, questions))
    return right / len(questions), scores


def next_token_logprobs(model, tokenizer, texts: Sequence[str]) -> list[torch.Tensor]:
    return [_logprobs(model, tokenizer(t)["input_ids"]) for t in texts]


def kl(reference: Sequence[torch.Tensor], logprobs: Sequence[torch.Tensor]) -> tuple[float, float]:
    """Mean KL(reference ‖ model) over every position, and top-1 agreement."""
    total, positions, agree = 0.0, 0, 0
    for p, q in zip(reference, logprobs, strict=True):
        total += float((p.exp() * (p - q)).sum(-1).clamp_min(0.0).double().sum())
        positions += p.shape[0]
        agree += int((p.argmax(-1) == q.argmax(-1)).sum())
    return total / positions, agree / positions


def retention_and_kl(model, source, tokenizer, data: dict[str, list]) -> dict[str, float]:
    """The metrics ``surgery eval MODEL --against SOURCE`` reports for the model (and the source's)."""
    texts, prompts = [p["text"] for p in data["passages"]], [p["text"] for p in data["prompts"]]
    out: dict[str, float] = {}
    for name, m in (("against", source), ("model", model)):
        out[f"{name}/perplexity"] = perplexity(m, tokenizer, texts)
        out[f"{name}/mcq_accuracy"], _ = mcq(m, tokenizer, data["mcq"])
    reference, logprobs = (
        next_token_logprobs(source, tokenizer, prompts),
        next_token_logprobs(model, tokenizer, prompts),
    )
    out["model/kl_mean"], out["model/top1_agreement"] = kl(reference, logprobs)
    first = sorted(float((p[-1].exp() * (p[-1] - q[-1])).sum().clamp_min(0.0)) for p, q in zip(reference, logprobs))
    out["model/first_token_kl_mean"] = sum(first) / len(first)
    for pct in (95, 99):  # linear interpolation between the two ranks around the percentile
        rank = pct / 100 * (len(first) - 1)
        low = int(rank)
        high = min(low + 1, len(first) - 1)
        out[f"model/first_token_kl_p{pct}"] = first[low] + (first[high] - first[low]) * (rank - low)
    return out
