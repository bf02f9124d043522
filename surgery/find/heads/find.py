"""find-heads as a library: pairs → scores (with the attribution-patching screen), discovery, knockout
confirmation of the heads put forward, knockout, dose-response → findings.

``find_heads(model_path, pairs, params)`` works on any list of :class:`Pair` (the shipped
benchmark, N4, or a synthetic task in our JSONL format) and returns versioned findings
(:class:`~surgery.find.heads.record.HeadsFindings`). ``cached_find_heads`` keys them by model
key (weights, tokenizer, chat template), pair set and parameters.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ... import __version__
from ...core import counted as wording
from ...core import distributed
from ...core.architectures import Architecture, architecture
from ...core.cache import cache_path
from ...core.checkpoint import Checkpoint
from ...core.errors import FindingsError, RecipeError, UnsupportedArchitecture
from ...core.mcq import is_instruct
from ...core.progress import Progress, silent
from ...model.hooks import model_architecture
from ...model.loadable import check_loadable
from ...model.loading import DEFAULT_LOAD, LoadSpec, as_checkpoint, load_model, load_tokenizer
from ..findings import Found, compute_record, dtype_key, new_findings, save_findings
from .attention import surgery_attention_on
from .baseline import Sequential, unreachable_note
from .causal import (
    PairRunner,
    confirmed_order,
    dose_conditions,
    dose_response,
    knockout_edit,
    knockout_report,
    knockout_sets,
    single_knockouts,
)
from .discovery import discover, rank_heads
from .flops import Counter
from .pairs import Pair
from .params import FindParams
from .record import HeadsFindings
from .scores import encode_pairs, option_token_ids, score_binding
from .screen import beyond_pool, pool_order, screen_heads, screen_record, spearman, still_open
from .work import dose_alphas, dose_passes, flops_note, screen_note, work_note


def pairs_sha256(pairs: Sequence[Pair]) -> str:
    """The sha256 of exactly the prompts measured (the findings' dataset hash)."""
    blob = json.dumps([p.to_dict() for p in pairs], sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()


def sample_records(records: Sequence[Mapping[str, Any]], limit: int | None, seed: int) -> list:
    """At most ``limit`` "≠" and ``limit`` "=" records, drawn with ``seed``."""
    if limit is None:
        return list(records)
    rng = random.Random(seed)
    out = []
    for split in ("diff", "equal"):
        rows = [r for r in records if r["split"] == split]
        out += rng.sample(rows, min(limit, len(rows)))
    return out


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items() if not isinstance(v, np.ndarray)}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def find_heads(
    model: Checkpoint | str | Path,
    pairs: Sequence[Pair],
    params: FindParams | Mapping[str, Any] = FindParams(),
    *,
    awareness_records: Sequence[Mapping[str, Any]] | None = None,
    load: LoadSpec = DEFAULT_LOAD,
    progress: Progress = silent,
    report: Callable[[str], None] = lambda m: None,
) -> HeadsFindings:
    """Scores with every head's screened knockout effect (screen.py), discovery, knockout
    confirmation of discovery's top ``params.confirm`` (unless ``params.exhaustive``: the screen's top
    ``params.screen_candidates()`` of them, then any other its error leaves a chance: screen.still_open),
    knockout against random sets until the p-value is decided (baseline.py; without the screen: all
    ``params.random_sets``) and (``params.dose_response``) dose-response on ``pairs``.

    The selection is the ``params.knockout_heads`` first heads of the confirmed ranking (without
    confirmation: of discovery's ranking); when fewer candidates are significant, the best of the
    rest fill it up, and ``confirmation.n_significant`` says so.
    """
    if not isinstance(params, FindParams):
        params = FindParams(**dict(params))
    ckpt = as_checkpoint(model, load)
    distributed.check_agree("the model and the pairs", ckpt.model_key(), pairs_sha256(pairs), params.to_dict())
    check_loadable(ckpt)
    arch = architecture(ckpt.config)
    check_token_attention(arch)
    check_observable(arch)
    tokenizer = load_tokenizer(ckpt.path, load)
    model = load_model(ckpt.path, load)
    cfg = model.config.get_text_config()
    # discovery and knockouts over the layers with attention heads (a hybrid model's attention layers)
    n_layers, n_heads = model_architecture(model).head_layers(), cfg.num_attention_heads
    instruct = is_instruct(tokenizer) if params.instruct is None else params.instruct
    report(work_note(len(pairs), params))
    rule = Sequential(params.random_sets, params.level if params.screened else None)
    if not rule.reachable:  # known from the options: said before the work, not minutes into it
        report(unreachable_note(params.random_sets, params.level))
    counter = Counter.of(model)
    screened = params.screened
    binding = encode_pairs(tokenizer, pairs, "binding", instruct)
    knowledge = encode_pairs(tokenizer, pairs, "knowledge", instruct)
    # the binding prompts run with features (full passes, kept for the knockouts) and the screen's
    # forward and backward from the first tested token; the knowledge probe shares prefixes
    binding_flops = counter.full(binding, params.batch_size)
    screen_flops = counter.screen_forward(binding, params.batch_size) if screened else 0
    backward = counter.backward(binding, params.batch_size) if screened else 0
    scoring = binding_flops + screen_flops + backward + counter.shared(knowledge, params.batch_size)
    scoring_full = binding_flops + counter.full(knowledge, params.batch_size)
    report(flops_note(counter, binding, scoring, scoring_full, params))
    findings = new_findings("heads", ckpt, pairs_sha256(pairs), params.to_dict(), __version__)
    findings["prompt_format"] = "instruct" if instruct else "base"
    findings["compute"] = compute_record(model)
    items = [p.item for p in pairs]
    n = len(pairs)
    usable = [i for i, p in enumerate(pairs) if "item" in p.match.spans]
    sub = [pairs[i] for i in usable]
    prompts = encode_pairs(tokenizer, sub, "binding", instruct)
    runner = PairRunner(
        model,
        prompts,
        [p.item for p in sub],
        option_token_ids(tokenizer),
        params.batch_size,
        keep_bytes=params.keep_memory,
        report=report,
    )
    with surgery_attention_on(model):
        # the scoring pass's baseline passes are the knockouts' (the same prompts, the same batches)
        # where every pair is knocked out: the sweeps then run no baseline pass of their own
        scores = score_binding(
            model,
            tokenizer,
            pairs,
            instruct=instruct,
            batch_size=params.batch_size,
            features=True,
            screen=screened,
            keep=runner.keep if len(usable) == n else None,
            progress=progress("scoring prompts", 4 * len(pairs)),
        )
        findings["pairs"] = {"n": len(pairs), "items": len(set(items)), "benchmark": params.benchmark}
        findings["scores"] = {
            "S": scores["S"],
            "K": scores["K"],
            "K_over_S": scores["K_over_S"],
            "option_token_ids": scores["option_token_ids"],
        }
        if len(usable) < n:
            report(
                f"{n - len(usable)} of {n} pairs do not name their item in the stem: left out of discovery and knockout"
            )
        feats = scores["features"]
        x = np.concatenate([feats[usable], feats[[n + i for i in usable]]])
        y = np.r_[np.ones(len(usable)), np.zeros(len(usable))]
        groups = [items[i] for i in usable] * 2
        disc = discover(
            x, y, groups, folds=params.folds, inner_folds=params.inner_folds, top=params.top_k, layers=n_layers
        )
        findings["discovery"] = disc
        runner.base = np.r_[scores["s"][usable], scores["s"][[n + i for i in usable]]]
        base = runner.base
        ranked = rank_heads(disc)
        chosen = ranked[: params.knockout_heads]
        rows = []
        if screened:
            atp = scores["screen"]
            rows = screen_heads(base, np.concatenate([atp[usable], atp[[n + i for i in usable]]]), n_layers, len(sub))
            delta_base = float(base[: len(sub)].mean() - base[len(sub) :].mean())
            findings["screen"] = screen_record(rows, delta_base, params.screen_candidates())
        if params.confirm:
            pool = ranked[: params.confirm]
            put = pool_order(rows, pool)[: params.screen_candidates()] if screened else pool
            # the visible cost: one pass over the binding prompts per candidate
            runner.progress = progress(
                f"knockout confirmation ({wording.counted(len(put), 'head')})", 2 * len(sub) * len(put)
            )
            confirmed = confirmation(runner, disc, put, params.seed, rows)
            while screened and (
                more := still_open(rows, pool_order(rows, pool), confirmed["heads"], params.knockout_heads)
            ):
                runner.progress = progress(f"knockout confirmation ({len(more)} more heads)", 2 * len(sub) * len(more))
                put = put + more
                confirmed = confirmation(runner, disc, put, params.seed, rows)
            findings["confirmation"] = confirmed
            chosen = [(h["layer"], h["head"]) for h in confirmed["heads"][: params.knockout_heads]]
            if screened:
                confirmed["predicted_selection"] = [list(h) for h in put[: params.knockout_heads]]
                weakest = min(h["effect_pct"] for h in confirmed["heads"][: params.knockout_heads])
                findings["screen"]["beyond_pool"] = beyond_pool(rows, pool, weakest)
                report(screen_note(confirmed, len(pool), findings["screen"]["beyond_pool"]))
        findings["selected_heads"] = [list(h) for h in chosen]
        grid = dose_alphas(params)
        steps = 2 * len(sub) * (2 + params.random_sets + dose_passes(params))
        advance, done = progress("causal tests", steps), [0]

        def counted(n: int = 1) -> None:
            done[0] += n
            advance(n)

        runner.progress = counted
        if params.dose_response:  # both known now: one sweep, one baseline pass per batch for both
            runner.prefetch(
                [
                    knockout_edit(h, q)
                    for h, q in knockout_sets(chosen, n_layers, n_heads, rule.first_chunk(), params.seed)
                ]
                + dose_conditions(chosen, grid)
            )
        findings["knockout"] = knockout_report(
            runner, chosen, n_layers, n_heads, random_sets=params.random_sets, seed=params.seed, level=rule.level
        )
        if params.dose_response:
            findings["dose_response"] = dose_response(runner, chosen, grid)
        # The random sets' sequential stop (and resumed rows) leave steps unrun: close the bar, or a
        # log's last line says "50 %, ~33s left" of work that is not coming.
        advance(max(0, steps - done[0]))
        forward = scoring - backward + runner.counter.flops
        # the denominator: every condition of the exhaustive procedure as one full pass
        today = min(params.confirm, len(ranked)) + 2 + params.random_sets + dose_passes(params)
        full_flops = scoring_full + today * counter.full(prompts, params.batch_size)
        findings["cost"] = {
            "forward_flops": forward,
            "backward_flops": backward,
            "forward_flops_full_passes": full_flops,
            "share_of_full_passes": (forward + backward) / full_flops,
        }
        report(
            f"FLOPs: {forward + backward:.3e} ({(forward + backward) / full_flops:.2f} of full passes, "
            f"{full_flops:.3e}" + (f"; the screen's backward {backward:.3e})" if backward else ")")
        )
        if params.dose_response and awareness_records:
            from .awareness import awareness_at

            recs = sample_records(awareness_records, params.awareness_max, params.seed)
            total = len(recs) * (1 + 2 * sum(a != 1.0 for a in params.awareness_alphas))
            findings["awareness"] = awareness_at(
                model,
                tokenizer,
                recs,
                chosen,
                params.awareness_alphas,
                instruct=instruct,
                batch_size=params.batch_size,
                progress=progress("awareness (generation)", total),
            )
    return HeadsFindings.from_dict(_jsonable(findings))


def check_token_attention(arch: Architecture) -> None:
    """find-heads measures attention from tokens to tokens: a model whose attention also reads other
    keys (DeepSeek-V4's compressed blocks) is refused before it is loaded."""
    if not arch.layout.limits.token_keys:
        raise UnsupportedArchitecture(
            f"find-heads: {arch.model_type}'s attention also reads compressed blocks of keys, not only the "
            "prompt's tokens, so its per-token binding features and edge knockouts are not defined; edit its "
            "heads with amplify-heads --heads or a recipe"
        )


def confirmation(
    runner: PairRunner,
    disc: Mapping[str, Any],
    candidates: Sequence[tuple[int, int]],
    seed: int,
    screened: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Single-head knockouts of ``candidates``, in confirmed order (causal.confirmed_order), with
    their discovery rank and (``screened``: the screen's ranked rows) screened effect and rank."""
    info = {(h["layer"], h["head"]): (rank, h) for rank, h in enumerate(disc["heads"], 1)}
    screen = {(r["layer"], r["head"]): (rank, r) for rank, r in enumerate(screened, 1)}
    rows = single_knockouts(runner, candidates, seed)
    for r in rows:
        rank, h = info[(r["layer"], r["head"])]
        r.update(discovery_rank=rank, coef=h["coef"], stability=h["stability"])
        if screen:
            rank, s = screen[(r["layer"], r["head"])]
            r.update(screen_rank=rank, screen_effect_pct=s["effect_pct"])
    rows = confirmed_order(rows)
    out = {
        "candidates": len(rows),
        "delta_base": runner.delta(runner.base)["delta"],
        "criterion": "95% bootstrap CI (items) of the single-head reduction above 0",
        "n_significant": sum(r["significant"] for r in rows),
        "heads": rows,
    }
    if screen:
        out["spearman"] = spearman([r["screen_effect_pct"] for r in rows], [r["effect_pct"] for r in rows])
    return out


def findings_cache(ckpt: Checkpoint, pairs: Sequence[Pair], params: FindParams, load: LoadSpec = DEFAULT_LOAD) -> Path:
    """Where findings are cached: a model run in bfloat16 gets findings of its own (scores stay float32)."""
    return cache_path("heads", ckpt.model_key(), pairs_sha256(pairs), {**params.findings_key(), **dtype_key(load)})


_BY_NAME = "amplify heads by name instead (amplify-heads --heads L.H; Python: amplify_heads(heads=...))"


def check_observable(arch: Architecture) -> None:
    """find-heads reads every layer's attention over the whole prompt. Layers that reuse an earlier
    layer's keys and values (no k_proj: Gemma 4's kv-shared layers) are run by transformers on the
    kept positions only, so their heads cannot be observed: one line saying what to do instead."""
    arch.check_findable("find-heads", _BY_NAME)
    if arch.layout.limits.find_heads_refusal:
        raise UnsupportedArchitecture(
            f"{arch.model_type}: find-heads cannot run on it: {arch.layout.limits.find_heads_refusal}; {_BY_NAME}"
        )
    shared = arch.geometry.kv_shared_layers
    if shared:
        which = f"layer {shared[0]} reuses" if len(shared) == 1 else f"layers {shared[0]}–{shared[-1]} reuse"
        raise UnsupportedArchitecture(
            f"{arch.model_type}: {which} an earlier layer's keys and values and transformers runs them on the "
            "kept positions only, so find-heads cannot observe their heads; "
            "amplify heads by name instead (amplify-heads --heads L.H; Python: amplify_heads(heads=...))"
        )


@dataclass
class HeadFindings(Found):
    """Head findings (see :class:`surgery.find.findings.Found`): scores, discovery, knockout, and the
    choice of the top heads as a recipe."""

    data: HeadsFindings
    kind: ClassVar[str] = "heads"
    record_type: ClassVar[type[HeadsFindings]] = HeadsFindings

    def check(self) -> None:
        try:
            self.data.ranking()
        except (TypeError, ValueError):
            raise FindingsError(
                f"{self.path} has no usable head ranking; recompute it with surgery find-heads"
            ) from None

    def options(self) -> str:
        """The find-heads options that differ from the defaults, as flags (``--max-pairs 96``)."""
        default = FindParams().findings_key()  # keep_memory changed the run's time, not these findings
        flags = []
        for name, value in (self.data.parameters or {}).items():
            if name == "extra" or name not in default or value == default[name]:
                continue
            if name == "instruct":
                flags.append(f"--format {'instruct' if value else 'base'}")
            else:
                flags.append(f"--{name.replace('_', '-')}" + ("" if value is True else f" {value}"))
        return " ".join(flags) or "the default options"

    def select(self, top: int | None = None) -> list[tuple[int, int]]:
        """The first ``top`` heads of the ranking (default: the knocked-out selection)."""
        if top is not None and top < 1:  # 0 would silently mean the default, a negative count cut from the end
            raise RecipeError(f"{{top}} must be ≥ 1, got {top}", "top")
        order = self.data.ranking()  # the knockout-confirmed ranking when the findings have one
        top = top or len(self.data.selected()) or 1
        if top > len(order):
            raise RecipeError(
                f"{{top}} {top} but the findings rank only {wording.counted(len(order), 'head')}; choose a smaller {{top}}",
                "top",
            )
        return order[:top]

    def record(self) -> dict[str, Any]:
        return {**self.data.summary(), **super().record()}


def cached_find_heads(
    model: Checkpoint | str | Path,
    pairs: Sequence[Pair],
    params: FindParams,
    *,
    recompute: bool = False,
    load: LoadSpec = DEFAULT_LOAD,
    **kwargs,
) -> HeadFindings:
    """The cached findings for (model, pairs, params), computed and cached on a miss."""
    ckpt = as_checkpoint(model, load)
    distributed.check_agree("the model and the pairs", ckpt.model_key(), pairs_sha256(pairs), params.to_dict())
    path = findings_cache(ckpt, pairs, params, load)
    hit = None if recompute else HeadFindings.cached(path, ckpt)
    if distributed.all_true(hit is not None):  # under torchrun: a cache miss on any rank computes on all
        return hit
    findings = find_heads(ckpt, pairs, params, load=load, **kwargs)
    if distributed.is_main():
        save_findings(findings, path)
    return HeadFindings(findings, path, from_cache=False)
