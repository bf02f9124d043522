"""Heads findings as a typed record: what find-heads measured, and the heads it chose.

:class:`HeadsFindings` is the findings file of ``surgery find-heads`` (its common head is
:class:`surgery.find.findings.Findings`): ΔS and ΔK (:class:`BindingScores`), discovery's ranking
(:class:`Discovery`), every head's screened knockout effect (:class:`Screen`), the single-head
knockouts that confirm the heads put forward (:class:`Confirmation`), the
selected heads, the knockout of the selection against a control and random heads
(:class:`Knockout`), the dose-response and the awareness runs. The finder builds the JSON and reads
it into this record; commands, the report and the bake's summary read the record's attributes.
Every part is optional (a report draws what a file has); choosing heads needs discovery's ranking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ...core.json_record import JsonRecord, entry, listof, part
from ..findings import Findings

Head = tuple[int, int]


@dataclass(kw_only=True)
class ScoreStats(JsonRecord):
    """Δ of one score (S or K) over the pairs, match − mismatch, with a paired t-test over items."""

    delta: float
    mean_match: float | None = None
    mean_mismatch: float | None = None
    n_pairs: int | None = None
    n_items: int | None = None
    delta_items: float | None = None
    t: float | None = None
    p: float | None = None
    option_mass: float | None = None  # the share of probability on the answer options


@dataclass(kw_only=True)
class BindingScores(JsonRecord):
    """ΔS (binding) and ΔK (knowledge) of a model on the binding benchmark."""

    S: ScoreStats | None = entry(codec=part(ScoreStats), default=None)
    K: ScoreStats | None = entry(codec=part(ScoreStats), default=None)
    K_over_S: float | None = None
    option_token_ids: dict[str, list[int]] | None = None

    @classmethod
    def of(cls, result: dict[str, Any]) -> BindingScores:
        """The scores of a ``score_binding`` result (its per-prompt arrays left out)."""
        return cls.read({k: result[k] for k in ("S", "K", "K_over_S", "option_token_ids") if k in result})


@dataclass(kw_only=True)
class RankedHead(JsonRecord):
    """A head in discovery's ranking."""

    layer: int
    head: int
    coef: float | None = None
    mean_fold_coef: float | None = None
    stability: float | None = None  # share of outer folds whose top-k holds the head
    effect_size: float | None = None


@dataclass(kw_only=True)
class Discovery(JsonRecord):
    """L1 logistic-regression discovery (surgery.find.heads.discovery): CV AUC and the ranking."""

    auc: float | None = None
    fold_aucs: list[float] | None = None
    fold_c: list[float] | None = entry("fold_C", default=None)
    final_c: float | None = entry("final_C", default=None)
    folds: int | None = None
    top_k: int | None = None
    heads: list[RankedHead] | None = entry(codec=listof(part(RankedHead)), default=None)
    stable_heads: list[list[int]] | None = None
    coef_grid: list[list[float]] | None = None  # layers × heads


@dataclass(kw_only=True)
class KnockoutResult(JsonRecord):
    """ΔS without and with the (queries → item) edges of some heads removed; effect and its 95% CI."""

    heads: list[list[int]] | None = None
    edges_from: str | None = None
    delta_base: float | None = None
    delta_knockout: float | None = None
    effect_pct: float | None = None
    ci95: list[float | None] | None = None


@dataclass(kw_only=True)
class ConfirmedHead(JsonRecord):
    """One candidate's single-head knockout, with its discovery rank."""

    layer: int
    head: int
    delta_knockout: float | None = None
    effect_pct: float | None = None
    ci95: list[float | None] | None = None
    significant: bool | None = None  # the 95% CI lies above 0
    discovery_rank: int | None = None
    coef: float | None = None
    stability: float | None = None
    screen_rank: int | None = None  # None: findings without the screen (--exhaustive, older files)
    screen_effect_pct: float | None = None


@dataclass(kw_only=True)
class Confirmation(JsonRecord):
    """Single-head knockouts of discovery's candidates, in confirmed order (significant first)."""

    candidates: int | None = None
    delta_base: float | None = None
    criterion: str | None = None
    n_significant: int
    heads: list[ConfirmedHead] = entry(codec=listof(part(ConfirmedHead)))
    spearman: float | None = None  # rank correlation of the screened and exact effects of these heads
    predicted_selection: list[list[int]] | None = None  # the screen's top heads of the pool


@dataclass(kw_only=True)
class ScreenedHead(JsonRecord):
    """One head's knockout effect as the attribution-patching screen estimates it."""

    layer: int
    head: int
    delta_knockout: float | None = None
    effect_pct: float | None = None


@dataclass(kw_only=True)
class Screen(JsonRecord):
    """The attribution-patching screen of every head (surgery.find.heads.screen), ranked."""

    method: str | None = None
    delta_base: float | None = None
    put_forward: int | None = None  # the screen's top heads of the pool knocked out first
    heads: list[ScreenedHead] = entry(codec=listof(part(ScreenedHead)))
    # heads outside discovery's candidates screened above the selection's weakest exact effect (a note)
    beyond_pool: list[ScreenedHead] | None = entry(default=None, codec=listof(part(ScreenedHead)))


@dataclass(kw_only=True)
class RandomKnockouts(JsonRecord):
    """The knockout of random head sets of the selection's size: the baseline the tested one beats."""

    n: int | None = None
    mean_pct: float | None = None
    sd_pct: float | None = None
    p95_pct: float | None = None
    share_ge_tested: float | None = None  # the share of the sets run at least as effective
    # The sequential Monte-Carlo test (surgery.find.heads.baseline); None in findings from before it.
    p: float | None = None
    cap: int | None = None
    level: float | None = None  # None: every set run (--exhaustive)
    stop_after: int | None = None
    stopped: str | None = None
    reachable: bool | None = None


@dataclass(kw_only=True)
class Knockout(JsonRecord):
    """The selection's knockout: tested identity, distractor control, random heads."""

    tested: KnockoutResult = entry(codec=part(KnockoutResult))
    control: KnockoutResult | None = entry(codec=part(KnockoutResult), default=None)
    random: RandomKnockouts | None = entry(codec=part(RandomKnockouts), default=None)
    random_sets: list[KnockoutResult] | None = entry(codec=listof(part(KnockoutResult)), default=None)


@dataclass(kw_only=True)
class DosePoint(JsonRecord):
    """ΔS at one α, edge-level (identity→item edges) and whole-head (the bakeable o_proj slice)."""

    alpha: float
    edge_delta_s: float | None = None
    edge_p: float | None = None
    whole_delta_s: float | None = None
    whole_p: float | None = None


@dataclass(kw_only=True)
class AwarenessScores(JsonRecord):
    """DiffAware / CtxtAware by greedy generation (surgery.evaluation.awareness)."""

    diffaware: float | None = None
    ctxtaware: float | None = None
    n_diff: int | None = None
    n_equal: int | None = None


@dataclass(kw_only=True)
class AwarenessPoint(JsonRecord):
    """Awareness at one α, edge-level and whole-head."""

    alpha: float
    edge: AwarenessScores = entry(codec=part(AwarenessScores))
    whole: AwarenessScores = entry(codec=part(AwarenessScores))


@dataclass(kw_only=True)
class HeadsFindings(Findings):
    """The findings file of find-heads (see the module docstring)."""

    kind: str = "heads"
    prompt_format: str | None = None
    pairs: dict[str, Any] | None = None
    scores: BindingScores | None = entry(codec=part(BindingScores), default=None)
    discovery: Discovery | None = entry(codec=part(Discovery), default=None)
    screen: Screen | None = entry(codec=part(Screen), default=None)  # None: --exhaustive, older files
    confirmation: Confirmation | None = entry(codec=part(Confirmation), default=None)  # None: --confirm 0
    selected_heads: list[list[int]] | None = None
    knockout: Knockout | None = entry(codec=part(Knockout), default=None)
    dose_response: list[DosePoint] | None = entry(codec=listof(part(DosePoint)), default=None)
    cost: dict[str, Any] | None = None
    awareness: list[AwarenessPoint] | None = entry(codec=listof(part(AwarenessPoint)), default=None)

    KIND: ClassVar[str] = "heads"
    KEY_ORDER = (
        "format",
        "version",
        "kind",
        "tool_version",
        "model",
        "dataset_sha256",
        "parameters",
        "prompt_format",
        "compute",
        "pairs",
        "scores",
        "discovery",
        "screen",
        "confirmation",
        "selected_heads",
        "knockout",
        "dose_response",
        "cost",
        "awareness",
    )

    def selected(self) -> list[Head]:
        """The heads the knockout tested (the selection), best first."""
        return [(int(layer), int(head)) for layer, head in self.selected_heads or []]

    def ranking(self) -> list[Head]:
        """Every head, best first: the selection, then the confirmed ranking (when the findings
        have one), then the rest of discovery's ranking. Raises ValueError without a discovery."""
        if self.discovery is None or self.discovery.heads is None:
            raise ValueError("no discovery ranking")
        confirmed = [(h.layer, h.head) for h in self.confirmation.heads] if self.confirmation else []
        ranked = [(h.layer, h.head) for h in self.discovery.heads]
        return list(dict.fromkeys(self.selected() + confirmed + ranked))

    def weak_heads(self) -> int | None:
        """How many selected heads have no significant single-head knockout (None: no confirmation).
        The confirmed ranking puts the significant candidates first, so they fill the selection first."""
        if self.confirmation is None:
            return None
        return max(0, len(self.selected()) - self.confirmation.n_significant)

    def summary(self) -> dict[str, Any]:
        """What a baked checkpoint records about the findings its heads came from (surgery.json's
        ``heads_findings``; surgery.core.heads_caveats reads it back on the card)."""
        tested = self.knockout.tested if self.knockout else KnockoutResult()
        s = self.scores.S if self.scores else None
        weak = self.weak_heads()
        return {
            "dataset_sha256": self.dataset_sha256,
            "model": self.model.path,
            "auc": self.discovery.auc if self.discovery else None,
            "delta_s": s.delta if s else None,
            "p_s": s.p if s else None,
            "knockout_effect_pct": tested.effect_pct,
            "knockout_ci95": tested.ci95,
            "selected_heads": self.selected_heads,
            "selection": "single-head knockout" if self.confirmation else "discovery ranking",
            **({"weak_heads": weak} if weak is not None else {}),
        }
