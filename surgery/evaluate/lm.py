"""Model-level measurements for evaluation: perplexity, log-likelihood of answer options, KL.

Everything runs in inference mode on the model's device and in its dtype; log-probabilities are
taken in fp32. Sequences are right-padded and masked, so batching never changes a number.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Sequence

import numpy as np
import torch

from ..core import distributed
from ..model.placement import input_device

Advance = Callable[[int], None]  # one measurement's advance(n); see surgery.core.progress
MAX_WINDOW = 1024  # tokens per perplexity window (longer texts are split, without overlap)


def _device(model) -> torch.device:
    return input_device(model)


def _pad_right(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[i, :len(s)] = 1
    return ids, mask


def _token_logprobs(model, seqs: Sequence[Sequence[int]], pad_id: int) -> list[torch.Tensor]:
    """For each sequence, log p(token t | tokens < t) for t = 1 … len − 1 (fp32)."""
    ids, mask = _pad_right(seqs, pad_id)
    device = _device(model)
    with torch.inference_mode():
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    picked = logp.gather(-1, ids[:, 1:].to(device).unsqueeze(-1)).squeeze(-1).cpu()
    return [picked[i, :len(s) - 1] for i, s in enumerate(seqs)]


def _windows(ids: list[int], window: int) -> list[list[int]]:
    return [ids[i:i + window] for i in range(0, len(ids), window) if len(ids[i:i + window]) > 1]


def perplexity(model, tokenizer, texts: Sequence[str], *, batch_size: int = 4,
               progress: Advance | None = None) -> dict[str, float]:
    """exp(mean negative log-likelihood per predicted token) over ``texts``.

    Each text is tokenized as the model would see it (special tokens included); its first token
    is context only. Texts longer than the model's context (or ``MAX_WINDOW``) are split.
    """
    limit = min(MAX_WINDOW, int(getattr(model.config, "max_position_embeddings", MAX_WINDOW) or MAX_WINDOW))
    windows = [_windows(tokenizer(t)["input_ids"], limit) for t in texts]
    seqs = [w for ws in windows for w in ws]
    # progress counts texts: a text is done with its last window (a long text has several)
    last_window = set(itertools.accumulate(len(ws) for ws in windows))
    nll, count, done = 0.0, 0, 0
    # under torchrun each rank takes whole batches; the sums are added up across ranks
    for start in distributed.shard(range(0, len(seqs), batch_size)):
        for lp in _token_logprobs(model, seqs[start:start + batch_size], tokenizer.pad_token_id or 0):
            nll -= float(lp.double().sum())
            count += lp.numel()
        ended = sum(end in last_window for end in range(start + 1, min(start + batch_size, len(seqs)) + 1))
        done += ended
        if progress:
            progress(ended)
    if distributed.under_torchrun():
        nll, total = distributed.all_reduce(np.array([nll, count]))
        count = int(round(total))
        distributed.catch_up(progress, done, len(texts))
    return {"perplexity": math.exp(nll / count) if count else math.nan,
            "nll_per_token": nll / count if count else math.nan, "tokens": count, "texts": len(texts)}


def option_logliks(model, tokenizer, pairs: Sequence[tuple[str, str]], *, batch_size: int = 16,
                   progress: Advance | None = None) -> list[float]:
    """Sum of log p(continuation tokens | context) for each (context, continuation) pair.

    Context and continuation are tokenized separately and joined, so the continuation's tokens are
    exactly those of the answer text (the usual log-likelihood multiple-choice method).
    """
    seqs, spans = [], []
    for context, continuation in pairs:
        ctx = tokenizer(context)["input_ids"]
        cont = tokenizer(continuation, add_special_tokens=False)["input_ids"]
        seqs.append(ctx + cont)
        spans.append((len(ctx), len(cont)))
    # longest first: padding is wasted only within similar lengths
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    scores = np.zeros(len(seqs))
    mine: list[int] = []
    # under torchrun each rank takes whole batches; the scores are gathered back into order
    for start in distributed.shard(range(0, len(order), batch_size)):
        batch = order[start:start + batch_size]
        lps = _token_logprobs(model, [seqs[i] for i in batch], tokenizer.pad_token_id or 0)
        for i, lp in zip(batch, lps):
            n_ctx, n_cont = spans[i]
            scores[i] = float(lp[n_ctx - 1:n_ctx - 1 + n_cont].double().sum())
        mine += batch
        if progress:
            progress(len(batch))
    if distributed.under_torchrun():
        scores = distributed.gather_rows(len(seqs), mine, scores[mine])
        distributed.catch_up(progress, len(mine), len(seqs))
    return [float(x) for x in scores]


def choose(logliks: Sequence[float], options: Sequence[str], normalize: bool) -> int:
    """The option with the highest log-likelihood (per character of the option when ``normalize``)."""
    scores = [ll / max(len(o), 1) if normalize else ll for ll, o in zip(logliks, options)]
    return max(range(len(scores)), key=scores.__getitem__)


def next_token_logprobs(model, tokenizer, texts: Sequence[str],
                        progress: Advance | None = None) -> list[torch.Tensor]:
    """log-softmax of the next-token logits at every position of each text (fp32, on CPU).

    Under torchrun, of this rank's texts only (:func:`kl_divergence` adds the ranks up): the
    reference and the model see the same shard, and vocab-wide rows never travel.
    """
    out = []
    device = _device(model)
    mine = distributed.shard(texts)
    for text in mine:
        ids = torch.tensor([tokenizer(text)["input_ids"]], device=device)
        with torch.inference_mode():
            out.append(torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1).cpu())
        if progress:
            progress(1)
    distributed.catch_up(progress, len(mine), len(texts))
    return out


def kl_divergence(reference: Sequence[torch.Tensor], model_logprobs: Sequence[torch.Tensor]) -> dict[str, float]:
    """KL(reference ‖ model) of next-token distributions, averaged over every position of every text
    (of every torchrun rank's texts: sums, counts and the maximum are reduced in float64)."""
    total, largest, positions, agree = 0.0, -math.inf, 0, 0
    for p, q in zip(reference, model_logprobs, strict=True):
        if p.shape != q.shape:
            from ..core.errors import SurgeryError

            raise SurgeryError("KL needs both models to share one tokenizer and vocabulary; compare a "
                               "checkpoint with its own source")
        kl = (p.exp() * (p - q)).sum(-1).clamp_min(0.0)
        total += float(kl.double().sum())
        largest = max(largest, float(kl.max()))
        positions += kl.numel()
        agree += int((p.argmax(-1) == q.argmax(-1)).sum())
    total, positions, agree = distributed.all_reduce(np.array([total, positions, agree]))
    largest = float(distributed.all_reduce(np.array([largest]), "max")[0])
    positions, agree = int(round(positions)), int(round(agree))
    return {"kl_mean": total / positions if positions else math.nan, "kl_max": largest, "positions": positions,
            "top1_agreement": agree / positions if positions else math.nan}
