"""``surgery eval``: retention, KL against the source, BBQ bias, DiffAware/CtxtAware, lm-eval.

Suites (each model is loaded once, in fp32, and runs every chosen suite):

- ``retention``: perplexity on the shipped passages; accuracy on the shipped four-option
  general-knowledge questions, each option scored by the sum of its tokens' log-likelihoods after
  ``"Question: …\\nAnswer:"``, the highest wins (lm-eval's ``acc``; the per-character normalised
  choice, ``acc_norm``, is in the details: it scores lower on SmolLM2, since these options are
  short names). With ``--against`` both are also given as % of the source's.
- ``kl``: KL(source ‖ model) of next-token distributions at every position of the shipped
  neutral prompts, and top-1 agreement; and the first-token KL (at each prompt's end: the first
  token either model would write) as mean, p95 and p99, overall and per language (needs ``--against``).
- ``bbq``: accuracy and signed bias score on BBQ-format files (see surgery.evaluation.bbq).
- ``awareness``: DiffAware / CtxtAware on an N4-format file (see surgery.evaluation.awareness).
- ``markers``: the share of greedy answers to the user's prompts that contain one of the user's
  markers (see surgery.evaluation.markers).
- ``lm-eval``: named lm-evaluation-harness tasks, when that package is installed.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import distributed
from ..core.errors import ParameterError, SurgeryError
from ..core.evaluation_result import measured, new_result, retained
from ..core.optional import require
from ..core.progress import Progress, silent
from ..model.loading import DEFAULT_LOAD, LoadSpec
from ..model.placement import check_offload_folder
from . import bbq as evaluate_bbq
from . import data as io
from . import lm
from . import source_cache as cache
from .awareness import awareness
from .params import SUITES, EvalParams


@dataclass
class SuitePlan:
    """What to run and on which data (loaded once, shared by both models)."""

    suites: tuple[str, ...]
    limit: int | None = None
    batch_size: int = 8
    retention: dict[str, list] = field(default_factory=dict)
    bbq: list[dict[str, Any]] = field(default_factory=list)
    n4: list[dict[str, Any]] = field(default_factory=list)
    lm_eval_tasks: tuple[str, ...] = ()
    lm_eval_include: Path | None = None
    marker_prompts: list[str] = field(default_factory=list)
    markers: list[str] = field(default_factory=list)
    max_new_tokens: int = 32
    settings: dict[str, Any] = field(default_factory=dict)


def make_plan(
    suites: Sequence[str] | None,
    *,
    against: bool,
    limit: int | None = None,
    bbq: Sequence[Path] = (),
    n4: Path | None = None,
    lm_eval_tasks: Sequence[str] = (),
    lm_eval_include: Path | None = None,
    batch_size: int = 8,
    prompts: Path | None = None,
    markers: Path | None = None,
    max_new_tokens: int = 32,
) -> SuitePlan:
    """Choose suites (default: every suite whose inputs were given) and load their data.

    ``suites``, ``limit``, ``batch_size`` and ``max_new_tokens`` are checked as :class:`EvalParams`
    (bounds, choices); ``prompts`` and ``markers`` (files) feed the markers suite, both or neither.
    """
    params = EvalParams(tuple(suites or ()), limit, batch_size, max_new_tokens)
    if (prompts is None) != (markers is None):
        raise ParameterError("the markers suite needs both {prompts} FILE and {markers} FILE", "prompts", "markers")
    given = {
        "retention": True,
        "kl": against,
        "bbq": bool(bbq),
        "awareness": n4 is not None,
        "markers": prompts is not None,
        "lm-eval": bool(lm_eval_tasks),
    }
    hints = {
        "kl": "--against SOURCE",
        "bbq": "--bbq FILE_OR_FOLDER",
        "awareness": "--n4 FILE",
        "markers": "--prompts FILE --markers FILE",
        "lm-eval": "--lm-eval TASKS",
    }
    if params.suites:
        for s in params.suites:
            if not given[s]:
                raise SurgeryError(f"--suite {s} needs {hints[s]}")
        chosen = tuple(s for s in SUITES if s in params.suites)
    else:
        chosen = tuple(s for s in SUITES if given[s])
    if "lm-eval" in chosen:
        require("lm_eval")  # fail before any model is loaded
    plan = SuitePlan(
        chosen, limit, params.batch_size, lm_eval_tasks=tuple(lm_eval_tasks), lm_eval_include=lm_eval_include
    )
    if "retention" in chosen or "kl" in chosen:
        plan.retention = io.retention_data(limit)
    if "bbq" in chosen:
        plan.bbq = evaluate_bbq.check_items(io.bbq_data(bbq, limit), "--bbq")
    if "awareness" in chosen:
        plan.n4 = io.n4_data(Path(n4), limit)
    if "markers" in chosen:
        from ..core.prompts import read_prompts
        from .markers import read_markers

        plan.marker_prompts = io.subsample(list(read_prompts(prompts, "prompts").prompts), limit)
        plan.markers, plan.max_new_tokens = read_markers(markers), params.max_new_tokens
    plan.settings = {
        "suites": list(chosen),
        "limit": limit,
        "bbq": [str(p) for p in io.bbq_files(bbq)] if bbq else [],
        "n4": str(n4) if n4 else None,
        "lm_eval": list(lm_eval_tasks),
        # what each number rests on: the retention data holds all three sets, each suite reads its own
        "items": {
            "passages": len(plan.retention.get("passages", [])) if "retention" in chosen else 0,
            "mcq": len(plan.retention.get("mcq", [])) if "retention" in chosen else 0,
            "prompts": len(plan.retention.get("prompts", [])) if "kl" in chosen else 0,
            "bbq": len(plan.bbq),
            "n4": len(plan.n4),
            **({"marker_prompts": len(plan.marker_prompts)} if plan.marker_prompts else {}),
        },
    }
    return plan


def run_suites(
    model,
    tokenizer,
    plan: SuitePlan,
    *,
    kl_reference: list | None = None,
    keep_reference: bool = False,
    progress: Progress = silent,
) -> dict[str, Any]:
    """Every suite of ``plan`` on one loaded model: {"metrics", "details", "reference"}."""
    metrics: dict[str, float] = {}
    details: dict[str, Any] = {}
    bs = plan.batch_size
    if "retention" in plan.suites:
        texts = [p["text"] for p in plan.retention["passages"]]
        details["perplexity"] = lm.perplexity(
            model, tokenizer, texts, batch_size=max(1, bs // 2), progress=progress("perplexity", len(texts))
        )
        details["mcq"] = mcq_accuracy(model, tokenizer, plan.retention["mcq"], bs, progress)
        metrics["perplexity"] = details["perplexity"]["perplexity"]
        metrics["mcq_accuracy"] = details["mcq"]["accuracy"]
    reference = None
    if "kl" in plan.suites or keep_reference:
        prompts = [p["text"] for p in plan.retention["prompts"]]
        reference = lm.next_token_logprobs(model, tokenizer, prompts, progress("KL prompts", len(prompts)))
        if kl_reference is not None:
            languages = [p.get("language", "en") for p in plan.retention["prompts"]]
            details["kl"] = lm.kl_divergence(kl_reference, reference, languages)
            metrics["kl_mean"] = details["kl"]["kl_mean"]
            metrics["top1_agreement"] = details["kl"]["top1_agreement"]
            first = details["kl"]["first_token"]
            metrics.update({f"first_token_kl_{k}": first[k] for k in ("mean", "p95", "p99")})
    if "bbq" in plan.suites:
        details["bbq"] = bbq(model, tokenizer, plan.bbq, bs, progress)
        metrics.update(
            {f"bbq_{k}": details["bbq"][k] for k in ("acc_ambig", "acc_disambig", "bias_ambig", "bias_disambig")}
        )
    if "awareness" in plan.suites:
        aw = awareness(model, tokenizer, plan.n4, batch_size=bs, progress=progress("awareness", len(plan.n4)))
        details["awareness"] = {k: v for k, v in aw.items() if k != "answers"}
        metrics["diffaware"], metrics["ctxtaware"] = aw["diffaware"], aw["ctxtaware"]
    if "markers" in plan.suites:
        from .markers import marker_rate

        details["markers"] = marker_rate(
            model,
            tokenizer,
            plan.marker_prompts,
            plan.markers,
            max_new_tokens=plan.max_new_tokens,
            batch_size=bs,
            progress=progress("answers", len(plan.marker_prompts)),
        )
        metrics["marker_rate"] = details["markers"]["rate"]
    if "lm-eval" in plan.suites:
        from .lmeval import run_lm_eval

        details["lm_eval"] = run_lm_eval(
            model, tokenizer, plan.lm_eval_tasks, limit=plan.limit, batch_size=bs, include_path=plan.lm_eval_include
        )
        metrics.update(details["lm_eval"]["metrics"])
    return {"metrics": metrics, "details": details, "reference": reference if keep_reference else None}


def mcq_accuracy(
    model, tokenizer, questions: list[dict[str, Any]], batch_size: int, progress: Progress
) -> dict[str, Any]:
    """Log-likelihood choice (``accuracy``) and the per-character normalised choice (``accuracy_norm``)."""
    pairs = [(f"Question: {q['question']}\nAnswer:", f" {c}") for q in questions for c in q["choices"]]
    ll = lm.option_logliks(
        model, tokenizer, pairs, batch_size=batch_size * 2, progress=progress("multiple choice", len(pairs))
    )
    norm = raw = 0
    start = 0
    for q in questions:
        opts = [f" {c}" for c in q["choices"]]
        scores = ll[start : start + len(opts)]
        start += len(opts)
        norm += lm.choose(scores, opts, normalize=True) == q["answer"]
        raw += lm.choose(scores, opts, normalize=False) == q["answer"]
    n = len(questions)
    return {
        "accuracy": raw / n if n else float("nan"),
        "accuracy_norm": norm / n if n else float("nan"),
        "n": n,
        "chance": sum(1 / len(q["choices"]) for q in questions) / n if n else float("nan"),
    }


def bbq(model, tokenizer, items: list[dict[str, Any]], batch_size: int, progress: Progress) -> dict[str, Any]:
    """BBQ answers by per-character log-likelihood, then accuracy and bias score.

    Normalised here (unlike the retention questions) because BBQ's "unknown" answers ("Can't be
    determined") are longer than the person answers: a raw sum would count against exactly the
    answer that the bias score depends on.
    """
    pairs = [(evaluate_bbq.prompt(it), o) for it in items for o in evaluate_bbq.options(it)]
    ll = lm.option_logliks(model, tokenizer, pairs, batch_size=batch_size, progress=progress("BBQ", len(pairs)))
    preds = [lm.choose(ll[3 * i : 3 * i + 3], evaluate_bbq.options(it), normalize=True) for i, it in enumerate(items)]
    return evaluate_bbq.score(items, preds)


def plan_digest(plan: SuitePlan) -> str:
    """The sha256 of what ``plan`` measures (suites, data, batching): torchrun ranks must agree on it."""
    blob = json.dumps(
        [
            plan.suites,
            plan.limit,
            plan.batch_size,
            plan.retention,
            plan.bbq,
            plan.n4,
            plan.lm_eval_tasks,
            str(plan.lm_eval_include),
            plan.marker_prompts,
            plan.markers,
            plan.max_new_tokens,
        ],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _checkpoint(path: Path):
    from ..core.checkpoint import Checkpoint

    return Checkpoint(path, allow_remote_code=True)


def _load(path: Path, load: LoadSpec):
    from ..model.loading import load_model, load_tokenizer

    return load_model(path, load), load_tokenizer(path, load)


def source_run(
    against: Path,
    fingerprint: str,
    plan: SuitePlan,
    *,
    load: LoadSpec = DEFAULT_LOAD,
    recompute: bool = False,
    progress: Progress = silent,
    report: Callable[[str], None] = lambda m: None,
) -> cache.SourceRun:
    """The source's metrics, details and KL reference: from the cache when it holds this source
    measured on this data in this way (unless ``recompute``), else measured and cached."""
    kl = "kl" in plan.suites
    n_prompts = len(plan.retention["prompts"]) if kl else 0
    keyed = cache.cacheable(plan.suites)
    if keyed:
        data = [plan.retention, plan.bbq, plan.n4] + (
            [plan.marker_prompts, plan.markers, plan.max_new_tokens] if plan.marker_prompts else []
        )
        json_path, tensors_path, key = cache.entry_paths(
            _checkpoint(against), fingerprint, data, plan.suites, plan.limit, load
        )
        hit = None if recompute else cache.read(json_path, tensors_path, key, n_prompts if kl else 0)
        if distributed.all_true(hit is not None):  # under torchrun: a miss on any rank measures on all
            report(f"the source's results come from the cache ({json_path})")
            return hit
    report(f"evaluating the source {against}")
    model, tok = _load(against, load)
    run = run_suites(model, tok, plan, keep_reference=kl, progress=progress)
    del model
    measured = cache.SourceRun(run["metrics"], run["details"], run["reference"], from_cache=False)
    if keyed:
        every = cache.gather_reference(run["reference"], n_prompts) if kl else None
        if distributed.is_main():
            cache.write(
                json_path,
                tensors_path,
                key,
                cache.SourceRun(measured.metrics, measured.details, every, False),
                n_prompts,
            )
    return measured


def evaluate(
    model_path: Path,
    plan: SuitePlan,
    *,
    against: Path | None = None,
    load: LoadSpec = DEFAULT_LOAD,
    recompute: bool = False,
    progress: Progress = silent,
    report: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Run ``plan`` on the model (and on ``against`` first, when given, or take the source's
    results from the cache); return the result JSON."""
    start = time.time()
    fingerprint = {p: _checkpoint(p).fingerprint() for p in (model_path, against) if p is not None}
    for path in fingerprint:  # each load checks its own model; the first would make the folder in the other
        check_offload_folder(path, load.offload_folder)
    result = new_result(
        measured(model_path, fingerprint[model_path]),
        measured(against, fingerprint[against]) if against else None,
        plan.settings,
    )
    distributed.check_agree(
        "the models and the evaluation data",
        result["model"]["fingerprint"],
        (result["against"] or {}).get("fingerprint"),
        plan_digest(plan),
    )
    reference = None
    if against is not None:
        source = source_run(
            against, fingerprint[against], plan, load=load, recompute=recompute, progress=progress, report=report
        )
        result["against"]["from_cache"] = source.from_cache
        result["metrics"]["against"], result["details"]["against"] = source.metrics, source.details
        reference = source.reference
    report(f"evaluating {model_path}")
    model, tok = _load(model_path, load)
    run = run_suites(model, tok, plan, kl_reference=reference, progress=progress)
    result["metrics"]["model"], result["details"]["model"] = run["metrics"], run["details"]
    for key, after in run["metrics"].items():
        pct = retained(key, result["metrics"]["against"].get(key), after)
        if pct is not None:
            result["retained_pct"][key] = pct
    result["seconds"] = round(time.time() - start, 1)
    return result
