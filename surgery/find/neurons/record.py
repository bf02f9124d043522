"""Neuron findings as a typed record: the pairs used, the routing of a mixture of experts, the top
neurons under the default options, and every neuron's scores.

:class:`NeuronsFindings` is the findings file of ``surgery find-neurons`` (its common head is
:class:`surgery.find.findings.Findings`). The scores stay the JSON the finder wrote (layers × width
arrays per category, the bulk of the file): :class:`~surgery.find.neurons.scores.NeuronScores`
parses them where they are used. :class:`NeuronSelection` is also what prune-neurons records in
surgery.json (``neuron_selection``) and what both commands show.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ...core.json_record import JsonRecord, entry, listof, mapof, part
from ..findings import Findings


@dataclass(kw_only=True)
class NeuronsDataset(JsonRecord):
    """The pairs a capture used: where they came from, how many, and those skipped (token counts
    differ between the two prompts of a pair), by category and by id."""

    source: str | None = None
    pairs: int | None = None
    pairs_used: int | None = None
    per_category: dict[str, int] | None = None
    skipped: dict[str, int] | None = None
    skipped_ids: list[Any] | None = None

    def brief(self) -> dict[str, Any]:
        """The record without the (possibly long) list of skipped ids."""
        return {k: v for k, v in self.to_dict().items() if k != "skipped_ids"}


@dataclass(kw_only=True)
class SelectedNeuron(JsonRecord):
    """One selected neuron and its scores, pooled over the selection's categories."""

    layer: int
    neuron: int
    expert: int | None = None
    label: str | None = None  # L:eE:N / L:s:N for an expert's neuron (surgery.core.edits.neuron_label)
    bias: float | None = None
    signed: float | None = None
    ppm: float | None = None
    activation: float | None = None
    fairness: float | None = None
    chosen_for: str | None = None  # the category whose turn chose it (per-category), else "pooled"/"all"
    top_category: str | None = None

    @property
    def name(self) -> str:
        """How tables name the neuron: its label, else its index."""
        return self.label if self.label is not None else str(self.neuron)


@dataclass(kw_only=True)
class CategoryOverlap(JsonRecord):
    """Jaccard index between the categories' top-n sets."""

    categories: list[str]
    n: int | None = None
    score: str | None = None
    jaccard: list[list[float]]


@dataclass(kw_only=True)
class NeuronSelection(JsonRecord):
    """A selection with its evidence: the options that chose it, the neurons, how many each layer
    holds, and the overlap of the categories' top sets (surgery.find.neurons.find.describe)."""

    n: int | None = None
    score: str | None = None
    rule: str | None = None
    bias_weight: float | None = None
    spare_active: float | None = None
    categories: list[str] | None = None
    layers: list[int] | None = entry(default=None, keep_none=True)  # None: every layer
    neurons: list[SelectedNeuron] | None = entry(codec=listof(part(SelectedNeuron)), default=None)
    layer_distribution: list[int] | None = None
    overlap: CategoryOverlap | None = entry(codec=part(CategoryOverlap), default=None)


@dataclass(kw_only=True)
class ExpertRouting(JsonRecord):
    """An expert whose routing share differs between the two sides of a category's pairs."""

    layer: int
    expert: int
    signed: float | None = None  # stereotyped − other
    mean_abs: float | None = entry("abs", default=None)  # mean |Δ| over pairs


@dataclass(kw_only=True)
class ExpertReport(JsonRecord):
    """Mixtures of experts: their size, the expert neurons no pair reached (unscored), and per
    category the experts whose routing differs most (surgery.find.neurons.routing)."""

    experts: int
    expert_width: int
    shared_width: int | None = None
    unscored_neurons: int
    routing: dict[str, list[ExpertRouting]] = entry(codec=mapof(listof(part(ExpertRouting))))


@dataclass(kw_only=True)
class NeuronsFindings(Findings):
    """The findings file of find-neurons (see the module docstring)."""

    kind: str = "neurons"
    dataset: NeuronsDataset | None = entry(codec=part(NeuronsDataset), default=None)
    experts: ExpertReport | None = entry(codec=part(ExpertReport), default=None)
    summary: NeuronSelection | None = entry(codec=part(NeuronSelection), default=None)
    scores: dict[str, Any] | None = None  # NeuronScores.to_dict(); parsed by NeuronScores.from_dict

    KIND: ClassVar[str] = "neurons"
