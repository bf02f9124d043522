"""Neuron findings computed once: pairs → token check → capture → scores → cached findings JSON.

The cache key is the model key (weights fingerprint, tokenizer files, chat template) + the pairs'
sha256 + the capture parameters, so a second ``prune-neurons`` with another --n (or score, rule,
factor) reads the file and runs no forward pass.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ... import __version__
from ...core import compact_json, distributed
from ...core.architectures import Architecture, architecture
from ...core.cache import cache_path
from ...core.checkpoint import Checkpoint
from ...core.counted import counted
from ...core.edit_kind import layer_list
from ...core.errors import UnsupportedArchitecture
from ...core.freed_memory import return_freed_memory
from ...core.progress import Progress, silent
from ...core.staging import atomic_write_text
from ...model.loadable import check_loadable
from ...model.loading import DEFAULT_LOAD, LoadSpec, load_model, load_tokenizer
from ..findings import Findings, Found, compute_record, dtype_key, new_findings
from .pairs import PairsError, PairSet, check_token_counts
from .params import DEFAULT_BIAS_WEIGHT, DEFAULT_RULE, DEFAULT_SCORE, DEFAULT_SPARE, SelectParams
from .ppm import ppm_scores
from .record import NeuronSelection, NeuronsFindings
from .routing import expert_report
from .scores import NeuronScores, accumulate_pair_sums
from .select import Selection, category_overlap, layer_distribution, neuron_rows, select

# What was captured and how; part of the cache key (bump "method" when the scores change meaning).
CAPTURE_PARAMS = {"method": 2, "site": "mlp.down_proj input", "pooling": "mean over real tokens", "dtype": "float32"}
# Mixtures of experts: each expert's intermediate activation, over the tokens routed to it.
EXPERT_CAPTURE_PARAMS = {
    **CAPTURE_PARAMS,
    "site": "expert intermediate (down_proj input) over routed tokens",
    "pooling": "mean over each prompt's real tokens routed to the expert",
}
# ... with dense MLP layers among the expert layers (DeepSeek's first k): those at their down_proj input.
MIXED_CAPTURE_PARAMS = {
    **EXPERT_CAPTURE_PARAMS,
    "site": "expert intermediate (down_proj input) over routed tokens; dense layers' down_proj input over real tokens",
}
# The summary stored in every findings file uses the commands' defaults.
SUMMARY_N = 40


@dataclass
class NeuronFindings(Found):
    """Neuron findings (see :class:`surgery.find.findings.Found`): every neuron's scores, and the
    selection of any n from them as a recipe."""

    data: NeuronsFindings
    # Selections already described, by (n, options, categories): find-neurons shows the one its file stores.
    _shown: dict[tuple, NeuronSelection] = field(default_factory=dict, init=False, repr=False, compare=False)
    kind: ClassVar[str] = "neurons"
    record_type: ClassVar[type[NeuronsFindings]] = NeuronsFindings

    @classmethod
    def computed(
        cls, data: NeuronsFindings, path: Path, scores: NeuronScores, summary: NeuronSelection
    ) -> NeuronFindings:
        """Findings just computed: ``scores`` are the parsed scores of ``data`` and ``summary`` its
        summary (under the commands' defaults), kept so that neither is made again."""
        found = cls(data, path, from_cache=False)
        found.__dict__["scores"] = scores  # the cached property, already known
        found._shown[(summary.n, SelectParams(), None)] = summary
        return found

    @functools.cached_property
    def scores(self) -> NeuronScores:
        return scores_of(self.data)

    def shown(self, n: int, options: SelectParams, categories: Sequence[str] | None = None) -> NeuronSelection:
        """The top ``n`` under ``options`` with its evidence (:func:`describe`), made once per choice."""
        key = (n, options, tuple(categories) if categories else None)
        if key not in self._shown:
            self._shown[key] = describe(self.scores, self.select(n, options, categories))
        return self._shown[key]

    def check(self) -> None:
        _ = self.scores  # parses every layer's scores: a damaged file raises SelectionError here

    def options(self) -> str:
        """Where the pairs came from and their categories."""
        dataset, params = self.data.dataset, self.data.parameters or {}
        categories = ", ".join(params.get("categories") or []) or "all categories"
        return f"pairs {dataset.source if dataset else 'unrecorded'}, {categories}"

    def select(
        self, n: int, options: SelectParams = SelectParams(), categories: Sequence[str] | None = None
    ) -> Selection:
        """The top ``n`` neurons under ``options`` (default: prune-neurons' score and rule; restricted
        to ``categories`` when given)."""
        return select(self.scores, n, **options.select_kwargs(categories))

    def record(self) -> dict[str, Any]:
        data = self.data
        return {
            **super().record(),
            "from_cache": self.from_cache,
            "model": data.model.path,
            "model_fingerprint": data.model.fingerprint,
            "dataset_sha256": data.dataset_sha256,
            "dataset": data.dataset.brief() if data.dataset else {},
            "parameters": data.parameters,
            "tool_version": data.tool_version,
        }


def write_findings(findings: Findings, path: Path) -> None:
    """Atomic write; lists of numbers go on one line each (a layer's scores), the rest indented."""
    atomic_write_text(Path(path), compact_json.dumps(findings.to_dict()) + "\n")


def describe(scores: NeuronScores, chosen: Selection) -> NeuronSelection:
    """A selection with its evidence: options, neuron rows, layer histogram, category overlap."""
    return NeuronSelection.read(
        {
            **chosen.options(),
            "neurons": neuron_rows(scores, chosen),
            "layer_distribution": layer_distribution(chosen, scores.shape[0]),
            "overlap": category_overlap(scores, chosen),
        }
    )


def selection_record(found: NeuronFindings, chosen: Selection, factor: float) -> dict[str, Any]:
    """What a bake of this selection adds to surgery.json: the selection with its evidence, and
    where the findings came from."""
    return {
        "neuron_selection": {**describe(found.scores, chosen).to_dict(), "factor": factor},
        "neuron_findings": found.record(),
    }


def summary(
    scores: NeuronScores,
    n: int,
    score: str = DEFAULT_SCORE,
    rule: str = DEFAULT_RULE,
    bias_weight: float = DEFAULT_BIAS_WEIGHT,
    categories: Sequence[str] | None = None,
    layers: Sequence[int] | None = None,
    spare_active: float = DEFAULT_SPARE,
) -> NeuronSelection:
    """Top-n neurons, layer histogram and category overlap for one choice of options."""
    chosen = select(
        scores,
        n,
        score=score,
        rule=rule,
        categories=categories,
        layers=layers,
        bias_weight=bias_weight,
        spare_active=spare_active,
    )
    return describe(scores, chosen)


def capture_params(pairs: PairSet, ckpt: Checkpoint | None = None, load: LoadSpec = DEFAULT_LOAD) -> dict[str, Any]:
    """What is captured, and how (the cache key's parameters): a mixture of experts (``ckpt``)
    captures its experts; a model run in bfloat16 gets findings of its own (sums stay float32)."""
    g = architecture(ckpt.config).geometry if ckpt is not None else None
    if g is None or not g.sparse_layers:
        site = CAPTURE_PARAMS
    else:
        site = EXPERT_CAPTURE_PARAMS if len(g.sparse_layers) == g.num_layers else MIXED_CAPTURE_PARAMS
    return {**site, **dtype_key(load), "categories": pairs.categories()}


def check_mlp_layers(arch: Architecture) -> None:
    """find-neurons ranks one kind of column per layer: a model some of whose layers have no dense MLP
    (a hybrid's state-space or attention-only layers, experts the table does not describe) is refused
    before it is loaded. Mixtures of experts are checked by their capture (experts.moe_layers)."""
    g = arch.geometry
    missing = [i for i in range(g.num_layers) if i not in arch.dense_mlp_layers() and not arch.is_sparse(i)]
    if missing:
        kinds = sorted({g.mlp_kinds[i] for i in missing})
        raise UnsupportedArchitecture(
            f"find-neurons: layers {layer_list(missing)} of this {arch.model_type} model are "
            f"{' and '.join(repr(k) for k in kinds)} layers without a dense MLP; find-neurons ranks models whose "
            "every layer has one (or experts); name the neurons with prune-neurons --neurons or a recipe"
        )


def scores_of(findings: NeuronsFindings) -> NeuronScores:
    """Every neuron's scores, parsed (a damaged file raises SelectionError, saying to recompute)."""
    return NeuronScores.from_dict(findings.scores or {})


def cached_path(ckpt: Checkpoint, pairs: PairSet, load: LoadSpec = DEFAULT_LOAD) -> Path:
    """Where findings for this model and these pairs are (or would be) cached."""
    return cache_path("neurons", ckpt.model_key(), pairs.sha256, capture_params(pairs, ckpt, load))


def check_one_width(arch: Architecture) -> None:
    """find-neurons scores every dense layer at one MLP width: a model whose widths differ by layer
    (Gemma 4's double-wide kv-shared layers) is one line saying what to do instead."""
    widths = sorted({arch.at(layer).geometry.intermediate_size for layer in arch.dense_mlp_layers()})
    if len(widths) > 1:
        raise UnsupportedArchitecture(
            f"{arch.model_type}: its MLP widths differ from layer to layer "
            f"({' and '.join(map(str, widths))} neurons), and find-neurons scores every layer at one width; "
            "prune or scale neurons by name instead "
            "(prune-neurons --neurons L:N; Python: prune_neurons(neurons=...))"
        )


def find_neurons(
    ckpt: Checkpoint,
    pairs: PairSet,
    *,
    batch_size: int = 16,
    strict: bool = False,
    load: LoadSpec = DEFAULT_LOAD,
    recompute: bool = False,
    progress: Progress = silent,
    report: Callable[[str], None] = lambda m: None,
) -> NeuronFindings:
    """Cached findings for (model, pairs, parameters), computing them on a miss."""
    arch = architecture(ckpt.config)
    arch.check_findable(
        "find-neurons",
        "prune or scale neurons by name instead (prune-neurons --neurons L:N; Python: prune_neurons(neurons=...))",
    )
    check_one_width(arch)
    params = capture_params(pairs, ckpt, load)
    distributed.check_agree("the model and the pairs", ckpt.model_key(), pairs.sha256, params, batch_size, strict)
    cached = cached_path(ckpt, pairs, load)
    hit = None if recompute else NeuronFindings.cached(cached, ckpt)
    if distributed.all_true(hit is not None):
        skipped = (hit.data.dataset.skipped if hit.data.dataset else None) or {}
        if strict and skipped:  # the cached run skipped pairs that --strict must refuse
            detail = ", ".join(f"{c} {n}" for c, n in skipped.items())
            raise PairsError(
                f"{counted(sum(skipped.values()), 'pair')} tokenize to different lengths in this model's "
                f"tokenizer ({detail}); fix them or drop --strict to skip them"
            )
        return hit

    check_loadable(ckpt)
    check_mlp_layers(architecture(ckpt.config))
    tokenizer = load_tokenizer(ckpt.path, load)
    check = check_token_counts(pairs, tokenizer, strict)
    if check.total_skipped:
        detail = ", ".join(f"{c} {n}" for c, n in check.skipped.items())
        report(
            f"skipped {check.total_skipped} of {len(pairs)} pairs whose prompts tokenize to different "
            f"lengths ({detail}); --strict makes this an error"
        )
    kept = check.kept
    model = load_model(ckpt.path, load)
    advance = progress("capturing prompts", 2 * len(kept))
    # Under torchrun each rank captures whole batches of its own; the float64 sums are then added up.
    work = distributed.Shard(kept.pairs, chunk=batch_size)
    sums = accumulate_pair_sums(model, tokenizer, work.units, batch_size, advance)
    ppm = ppm_scores(model)
    sums = sums.all_reduced(kept.categories(), ppm.shape)
    work.finish(advance, per_item=2)  # two prompts a pair
    stored = NeuronScores.stored(sums, ppm)  # rounded once: what the file holds and what selects
    scores = NeuronScores.from_dict(stored)
    compute = compute_record(model)
    dropped = weakref.ref(model)
    del model
    # What the model held goes back to the system: a bake that follows (prune-neurons) loads it again.
    return_freed_memory(dropped)

    findings = new_findings("neurons", ckpt, pairs.sha256, params, __version__)
    findings["compute"] = compute
    findings["dataset"] = {
        "source": pairs.source,
        "pairs": len(pairs),
        "pairs_used": len(kept),
        "per_category": scores.counts,
        "skipped": check.skipped,
        "skipped_ids": list(check.skipped_ids),
    }
    if scores.experts is not None:
        findings["experts"] = expert_report(scores)
    shown = summary(scores, min(SUMMARY_N, scores.shape[0] * scores.shape[1] // 2))
    findings["summary"] = shown.to_dict()
    findings["scores"] = stored
    record = NeuronsFindings.from_dict(findings)
    if distributed.is_main():
        write_findings(record, cached)
    return NeuronFindings.computed(record, cached, scores, shown)
