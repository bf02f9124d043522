"""Model-level measurements for evaluation: perplexity, log-likelihood of answer options, KL.

Everything runs in inference mode on the model's device and in its dtype; log-probabilities are
taken in fp32. Sequences are right-padded and masked, so batching changes a number only by float
rounding (a batch's shape can change a row's summation order).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..core import distributed
from ..core.errors import SurgeryError
from ..model.placement import input_device

Advance = Callable[[int], None]  # one measurement's advance(n); see surgery.core.progress
MAX_WINDOW = 1024  # tokens per perplexity window (longer texts are split, without overlap)
# positions whose logits are turned into log-probabilities at once (bounds the fp32 temporaries)
ROWS_PER_CHUNK = 256
# KL prompts go to torchrun ranks this many consecutive prompts at a time, and batches form within
# such a chunk: a prompt shares its forward pass with the same others in one process as under
# torchrun, so both give the same bits (a batch's shape can change a row's rounding).
KL_CHUNK = 16


def _device(model) -> torch.device:
    return input_device(model)


def _pad_right(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def _target_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) under ``logits`` (…, V), in fp32, a chunk of positions at a time: no
    full-vocabulary log-softmax of every position is held at once.

    torch's fp32 log_softmax, as before: on CPU it sits ~1e-5 nats per token from a float64
    logsumexp, so another formula would move perplexities by ~1e-5 relative.
    """
    flat, picked = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).to(logits.device)
    out = torch.empty(picked.shape, dtype=torch.float32, device=logits.device)
    for s in range(0, flat.shape[0], ROWS_PER_CHUNK):
        rows = torch.log_softmax(flat[s : s + ROWS_PER_CHUNK].float(), dim=-1)
        out[s : s + ROWS_PER_CHUNK] = rows.gather(-1, picked[s : s + ROWS_PER_CHUNK, None])[:, 0]
    return out.reshape(targets.shape)


def _token_logprobs(model, seqs: Sequence[Sequence[int]], pad_id: int) -> list[torch.Tensor]:
    """For each sequence, log p(token t | tokens < t) for t = 1 … len − 1 (fp32)."""
    ids, mask = _pad_right(seqs, pad_id)
    device = _device(model)
    with torch.inference_mode():
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        picked = _target_logprobs(logits[:, :-1], ids[:, 1:]).cpu()
    return [picked[i, : len(s) - 1] for i, s in enumerate(seqs)]


def _windows(ids: list[int], window: int) -> list[list[int]]:
    return [ids[i : i + window] for i in range(0, len(ids), window) if len(ids[i : i + window]) > 1]


def perplexity(
    model, tokenizer, texts: Sequence[str], *, batch_size: int = 4, progress: Advance | None = None
) -> dict[str, float]:
    """exp(mean negative log-likelihood per predicted token) over ``texts``.

    Each text is tokenized as the model would see it (special tokens included); its first token
    is context only. Texts longer than the model's context (or ``MAX_WINDOW``) are split.
    """
    limit = min(MAX_WINDOW, int(getattr(model.config, "max_position_embeddings", MAX_WINDOW) or MAX_WINDOW))
    windows = [_windows(tokenizer(t)["input_ids"], limit) for t in texts]
    seqs = [w for ws in windows for w in ws]
    owner = [i for i, ws in enumerate(windows) for _ in ws]
    left = [len(ws) for ws in windows]  # progress counts texts: a text is done with its last window
    # longest first: a batch pads only to similar lengths
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    nll, count = 0.0, 0
    # under torchrun each rank takes whole batches; the sums are added up across ranks
    work = distributed.Shard(range(0, len(order), batch_size), len(texts))
    for start in work:
        batch = order[start : start + batch_size]
        ended = []
        for i, lp in zip(batch, _token_logprobs(model, [seqs[i] for i in batch], tokenizer.pad_token_id or 0)):
            nll -= float(lp.double().sum())
            count += lp.numel()
            left[owner[i]] -= 1
            if left[owner[i]] == 0:
                ended.append(owner[i])
        work.done(ended)
        if progress:
            progress(len(ended))
    # texts without a window (one token or none) are done from the start
    empty = [i for i, ws in enumerate(windows) if not ws]
    if progress and empty:
        progress(len(empty))
    work.done(empty)
    nll, count = (float(v) for v in work.sum(nll, count))
    count = int(round(count))
    work.finish(progress)
    return {
        "perplexity": math.exp(nll / count) if count else math.nan,
        "nll_per_token": nll / count if count else math.nan,
        "tokens": count,
        "texts": len(texts),
    }


def _context_batches(contexts: Sequence[tuple[int, ...]], batch_size: int) -> list[list[int]]:
    """Indices of ``contexts`` in batches of one token length (longest first): without padding a
    batch's continuations all start at the same position of the shared cache."""
    by_length: dict[int, list[int]] = {}
    for i, c in enumerate(contexts):
        by_length.setdefault(len(c), []).append(i)
    return [
        same[s : s + batch_size]
        for n in sorted(by_length, reverse=True)
        for same in [by_length[n]]
        for s in range(0, len(same), batch_size)
    ]


def _continuation_scores(
    model, context_ids: list[tuple[int, ...]], continuations: list[tuple[int, list[int]]]
) -> list[float]:
    """Sum of log p(continuation) for each (context row, continuation tokens), the contexts (of one
    length) run once: their last position scores every first token, and the later tokens of every
    continuation run in one forward pass on the contexts' key/value cache (the same attention as
    the joined sequence), right-padded to the longest: a padded position comes after every real
    one, so no real position attends to it."""
    device = _device(model)
    ids = torch.tensor(context_ids, dtype=torch.long, device=device)
    longer = [k for k, (_, cont) in enumerate(continuations) if len(cont) > 1]
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=bool(longer), logits_to_keep=1)
        first = _target_logprobs(
            out.logits[[row for row, _ in continuations], -1],
            torch.tensor([cont[0] if cont else 0 for _, cont in continuations]),
        )
        parts = [[float(lp)] if cont else [] for lp, (_, cont) in zip(first.cpu(), continuations)]
        if longer:
            # the continuation's last token is only predicted, never an input
            inputs, mask = _pad_right([continuations[k][1][:-1] for k in longer], 0)
            cache = out.cache
            cache.reorder_cache(torch.tensor([continuations[k][0] for k in longer], dtype=torch.long, device=device))
            context_mask = torch.ones((len(longer), ids.shape[1]), dtype=torch.long)
            logits = model(
                input_ids=inputs.to(device),
                attention_mask=torch.cat([context_mask, mask], dim=1).to(device),
                cache=cache,
                use_cache=True,
            ).logits
            for row, k in enumerate(longer):
                cont = continuations[k][1]
                parts[k] += _target_logprobs(logits[row, : len(cont) - 1], torch.tensor(cont[1:])).cpu().tolist()
    # summed in float64, in token order
    return [float(torch.tensor(p, dtype=torch.float64).sum()) for p in parts]


def option_logliks(
    model, tokenizer, pairs: Sequence[tuple[str, str]], *, batch_size: int = 16, progress: Advance | None = None
) -> list[float]:
    """Sum of log p(continuation tokens | context) for each (context, continuation) pair.

    Context and continuation are tokenized separately and joined, so the continuation's tokens are
    exactly those of the answer text (the usual log-likelihood multiple-choice method). Pairs that
    share a context (a question's options) run it once; ``batch_size`` contexts per forward pass.
    """
    shared: dict[tuple[int, ...], list[tuple[int, list[int]]]] = {}
    for i, (context, continuation) in enumerate(pairs):
        ctx = tuple(tokenizer(context)["input_ids"])
        if not ctx:
            raise SurgeryError(f"the context {context!r} has no tokens: its first answer token has nothing to follow")
        shared.setdefault(ctx, []).append((i, list(tokenizer(continuation, add_special_tokens=False)["input_ids"])))
    contexts = list(shared)
    scores = np.zeros(len(pairs))
    # under torchrun each rank takes whole batches; the scores are gathered back into order
    work = distributed.Shard(_context_batches(contexts, batch_size), len(pairs))
    for batch in work:
        rows = [(row, i, cont) for row, c in enumerate(batch) for i, cont in shared[contexts[c]]]
        got = _continuation_scores(model, [contexts[c] for c in batch], [(row, cont) for row, _, cont in rows])
        for (_, i, _), score in zip(rows, got):
            scores[i] = score
        work.done(i for _, i, _ in rows)
        if progress:
            progress(len(rows))
    (scores,) = work.gather(scores)
    work.finish(progress)
    return [float(x) for x in scores]


def choose(logliks: Sequence[float], options: Sequence[str], normalize: bool) -> int:
    """The option with the highest log-likelihood (per character of the option when ``normalize``)."""
    scores = [ll / max(len(o), 1) if normalize else ll for ll, o in zip(logliks, options)]
    return max(range(len(scores)), key=scores.__getitem__)


def kl_prompt_shard(n: int) -> list[int]:
    """The indices of the ``n`` KL prompts this torchrun rank measures (all of them in one process)."""
    return distributed.shard(range(n), KL_CHUNK)


def next_token_logprobs(model, tokenizer, texts: Sequence[str], progress: Advance | None = None) -> list[torch.Tensor]:
    """log-softmax of the next-token logits at every position of each text (fp32, on CPU).

    Of every ``KL_CHUNK`` consecutive texts, those of similar length run together, right-padded, at
    most ``ROWS_PER_CHUNK`` positions a forward pass (a longer text alone): one short prompt per pass
    would leave most of each matrix product's rows unused. Under torchrun, of this rank's texts only
    (:func:`kl_prompt_shard`; :func:`kl_divergence` adds the ranks up): the reference and the model
    see the same shard, and vocab-wide rows never travel.
    """
    device = _device(model)
    mine = kl_prompt_shard(len(texts))
    seqs = [tokenizer(texts[i])["input_ids"] for i in mine]
    out: list[torch.Tensor] = [torch.empty(0)] * len(seqs)
    for start in range(0, len(seqs), KL_CHUNK):  # this rank's chunks lie end to end in ``mine``
        lengths = [len(s) for s in seqs[start : start + KL_CHUNK]]
        for batch in ([start + i for i in b] for b in _position_batches(lengths, ROWS_PER_CHUNK)):
            ids, mask = _pad_right([seqs[i] for i in batch], tokenizer.pad_token_id or 0)
            with torch.inference_mode():
                logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
                for row, i in enumerate(batch):
                    out[i] = torch.log_softmax(logits[row, : len(seqs[i])].float(), dim=-1).cpu()
            if progress:
                progress(len(batch))
    distributed.catch_up(progress, len(mine), len(texts))
    return out


def _position_batches(lengths: Sequence[int], positions: int) -> list[list[int]]:
    """Indices of ``lengths``, longest first, in batches whose padded size (rows × longest) stays
    within ``positions`` (a longer sequence makes a batch of its own)."""
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= positions:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def kl_divergence(
    reference: Sequence[torch.Tensor], model_logprobs: Sequence[torch.Tensor], languages: Sequence[str] | None = None
) -> dict[str, Any]:
    """KL(reference ‖ model) of next-token distributions, averaged over every position of every text
    (of every torchrun rank's texts: sums, counts and the maximum are reduced in float64).

    With ``languages`` (one per text, all texts) also the *first-token* KL: at each text's last
    position, the distribution of the first token the models would write — what a direction edit
    must leave alone on neutral prompts — as mean, p95 and p99 over the texts, overall and per language.
    """
    total, largest, positions, agree, first = 0.0, -math.inf, 0, 0, []
    for p, q in zip(reference, model_logprobs, strict=True):
        if p.shape != q.shape:
            raise SurgeryError(
                "KL needs both models to share one tokenizer and vocabulary; compare a checkpoint with its own source"
            )
        kl = (p.exp() * (p - q)).sum(-1).clamp_min(0.0)
        total += float(kl.double().sum())
        largest = max(largest, float(kl.max()))
        positions += kl.numel()
        agree += int((p.argmax(-1) == q.argmax(-1)).sum())
        first.append(float(kl[-1]))
    total, positions, agree = distributed.all_reduce(np.array([total, positions, agree]))
    largest = float(distributed.all_reduce(np.array([largest]), "max")[0])
    positions, agree = int(round(positions)), int(round(agree))
    out: dict[str, Any] = {
        "kl_mean": float(total) / positions if positions else math.nan,  # a Python float, not numpy's
        "kl_max": largest,
        "positions": positions,
        "top1_agreement": agree / positions if positions else math.nan,
    }
    if languages is not None:
        n = len(languages)
        every = distributed.gather_rows(n, kl_prompt_shard(n), np.array(first, dtype=np.float64))
        out["first_token"] = {
            **_spread(every),
            "per_language": {
                lang: _spread(every[[i for i, x in enumerate(languages) if x == lang]])
                for lang in sorted(set(languages))
            },
        }
    return out


def _spread(values: np.ndarray) -> dict[str, Any]:
    """Mean, 95th and 99th percentile (linear interpolation) and count of per-text KLs."""
    if not len(values):
        return {"mean": math.nan, "p95": math.nan, "p99": math.nan, "n": 0}
    return {
        "mean": float(values.mean()),
        "p95": float(np.percentile(values, 95)),
        "p99": float(np.percentile(values, 99)),
        "n": int(len(values)),
    }
