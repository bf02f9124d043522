"""Neuron findings computed once: pairs → token check → capture → scores → cached findings JSON.

The cache key is the model fingerprint + the pairs' sha256 + the capture parameters, so a second
``prune-neurons`` with another --n (or score, rule, factor) reads the file and runs no forward pass.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from . import __version__
from .checkpoint import Checkpoint
from .errors import FindingsError
from .findings import atomic_write_text, cache_path, check_model, load_findings, new_findings
from .models import DEFAULT_LOAD, LoadSpec, load_model, load_tokenizer
from .neuron_select import (DEFAULT_RULE, DEFAULT_SCORE, DEFAULT_SPARE, Selection, category_overlap,
                            layer_distribution, neuron_rows, select)
from .neurons import DEFAULT_BIAS_WEIGHT, NeuronScores, SelectionError, accumulate_pair_sums, ppm_scores
from .pairs import PairSet, PairsError, check_token_counts
from .patching import check_loadable
from .progress import Progress, silent

# What was captured and how; part of the cache key (bump "method" when the scores change meaning).
CAPTURE_PARAMS = {"method": 2, "site": "mlp.down_proj input", "pooling": "mean over real tokens",
                  "dtype": "float32"}
# The summary stored in every findings file uses the commands' defaults.
SUMMARY_N = 40
_NUMBER_LIST = re.compile(r"\[[-+0-9.eE,\s]*\]")


@dataclass
class FoundNeurons:
    """Findings (the JSON dict), its scores, and where the findings live."""

    findings: dict[str, Any]
    scores: NeuronScores
    path: Path
    from_cache: bool
    transfer_note: str | None = None  # set when --transfer applied findings of another model


def write_findings(findings: Mapping[str, Any], path: Path) -> None:
    """Atomic write; lists of numbers go on one line each (a layer's scores), the rest indented."""
    text = json.dumps(findings, indent=1, ensure_ascii=False)
    text = _NUMBER_LIST.sub(lambda m: re.sub(r"\s+", "", m.group(0)), text)
    atomic_write_text(Path(path), text + "\n")


def describe(scores: NeuronScores, chosen: Selection) -> dict[str, Any]:
    """A selection with its evidence: options, neuron rows, layer histogram, category overlap."""
    return {**chosen.options(), "neurons": neuron_rows(scores, chosen),
            "layer_distribution": layer_distribution(chosen, scores.shape[0]),
            "overlap": category_overlap(scores, chosen)}


def summary(scores: NeuronScores, n: int, score: str = DEFAULT_SCORE, rule: str = DEFAULT_RULE,
            bias_weight: float = DEFAULT_BIAS_WEIGHT, categories: Sequence[str] | None = None,
            layers: Sequence[int] | None = None, spare_active: float = DEFAULT_SPARE) -> dict[str, Any]:
    """Top-n neurons, layer histogram and category overlap for one choice of options."""
    chosen = select(scores, n, score=score, rule=rule, categories=categories, layers=layers,
                    bias_weight=bias_weight, spare_active=spare_active)
    return describe(scores, chosen)


def capture_params(pairs: PairSet) -> dict[str, Any]:
    return {**CAPTURE_PARAMS, "categories": pairs.categories()}


def scores_of(findings: Mapping[str, Any]) -> NeuronScores:
    return NeuronScores.from_dict(findings.get("scores") or {})


def load_neuron_findings(path: str | Path, ckpt: Checkpoint, transfer: bool = False) -> FoundNeurons:
    """A findings file given by the user, checked against the model it is applied to."""
    findings = load_findings(path, "neurons")
    note = check_model(findings, ckpt, allow_transfer=transfer)
    return FoundNeurons(findings, scores_of(findings), Path(path), from_cache=True, transfer_note=note)


def cached_path(ckpt: Checkpoint, pairs: PairSet) -> Path:
    """Where findings for this model and these pairs are (or would be) cached."""
    return cache_path("neurons", ckpt.fingerprint(), pairs.sha256, capture_params(pairs))


def _cache_hit(path: Path, ckpt: Checkpoint) -> FoundNeurons | None:
    """The cached findings, or None when there are none or they are damaged or stale (then they
    are recomputed, as find-heads does: a cache entry is never trusted over a fresh capture)."""
    if not path.is_file():
        return None
    try:
        findings = load_findings(path, "neurons")
        check_model(findings, ckpt)
        return FoundNeurons(findings, scores_of(findings), path, from_cache=True)
    except (FindingsError, SelectionError):
        return None


def find_neurons(ckpt: Checkpoint, pairs: PairSet, *, batch_size: int = 16, strict: bool = False,
                 load: LoadSpec = DEFAULT_LOAD, recompute: bool = False,
                 progress: Progress = silent,
                 report: Callable[[str], None] = lambda m: None) -> FoundNeurons:
    """Cached findings for (model, pairs, parameters), computing them on a miss."""
    params = capture_params(pairs)
    cached = cached_path(ckpt, pairs)
    hit = None if recompute else _cache_hit(cached, ckpt)
    if hit is not None:
        skipped = (hit.findings.get("dataset") or {}).get("skipped") or {}
        if strict and skipped:  # the cached run skipped pairs that --strict must refuse
            detail = ", ".join(f"{c} {n}" for c, n in skipped.items())
            raise PairsError(f"{sum(skipped.values())} pair(s) tokenize to different lengths in this model's "
                             f"tokenizer ({detail}); fix them or drop --strict to skip them")
        return hit

    check_loadable(ckpt)
    tokenizer = load_tokenizer(ckpt.path, load)
    check = check_token_counts(pairs, tokenizer, strict)
    if check.total_skipped:
        detail = ", ".join(f"{c} {n}" for c, n in check.skipped.items())
        report(f"skipped {check.total_skipped} of {len(pairs)} pairs whose prompts tokenize to different "
               f"lengths ({detail}); --strict makes this an error")
    kept = check.kept
    model = load_model(ckpt.path, load)
    sums = accumulate_pair_sums(model, tokenizer, kept.pairs, batch_size, progress("capturing prompts", 2 * len(kept)))
    scores = NeuronScores.from_sums(sums, ppm_scores(model))
    del model

    findings = new_findings("neurons", ckpt, pairs.sha256, params, __version__)
    findings["dataset"] = {
        "source": pairs.source, "pairs": len(pairs), "pairs_used": len(kept),
        "per_category": scores.counts, "skipped": check.skipped, "skipped_ids": list(check.skipped_ids),
    }
    findings["summary"] = summary(scores, min(SUMMARY_N, scores.shape[0] * scores.shape[1] // 2))
    findings["scores"] = scores.to_dict()
    write_findings(findings, cached)
    return FoundNeurons(findings, scores, cached, from_cache=False)
