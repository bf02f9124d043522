"""``surgery report``: one markdown page with figures from findings files, tune records and eval results.

Findings files (heads, neurons or directions, the common head of surgery.find.findings), tune
records (``tune.json`` of ``surgery tune``) and eval results (``surgery eval --out``) are read as given; every section is drawn only when its data is present,
so a report of a partial run is still a valid report. The folder is written atomically.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..bake.bake import hash_files
from ..core.counted import counted
from ..core.errors import FindingsError
from ..core.evaluation_result import RESULT_FORMAT, card_summary, load_result
from ..core.heads_caveats import caveats
from ..core.staging import staged_output
from ..core.strict_files import DuplicateKey, load_json
from ..find.finders import finder, kinds
from ..find.findings import Findings, load_findings
from ..find.tune.record import FILE as TUNE_FILE
from ..find.tune.record import FORMAT as TUNE_FORMAT
from ..find.tune.record import TuneRecord, read_record

if TYPE_CHECKING:
    from ..find.directions.record import DirectionsFindings
    from ..find.heads.record import HeadsFindings
    from ..find.neurons.record import ExpertReport, NeuronsFindings

REPORT_NAME = "report.md"
# What the report was drawn from; it marks the folder as surgery's (see surgery.core.destinations).
MANIFEST_NAME = "surgery_report.json"


def read_findings(path: Path) -> Findings | TuneRecord:
    """A findings file of any kind (its 'kind' field says which), as that kind's record, or a tune record."""
    if Path(path).is_dir():  # "not readable" would not say what to give instead
        inside = Path(path) / TUNE_FILE
        raise FindingsError(
            f"{path} is a folder; surgery report reads files: findings JSON (find-heads / find-neurons / "
            "find-direction --out), a tune record"
            + (f" (here: {inside})" if inside.is_file() else " (tune.json)")
            + " and eval results (--eval); a baked checkpoint describes itself in its README.md (surgery card)"
        )
    if not Path(path).exists():  # "not readable" would send the user to the file's content
        raise FindingsError(f"{path} does not exist; give a findings JSON, a tune record or an eval result")
    try:
        raw = load_json(Path(path).read_text(encoding="utf-8"))
        kind = raw.get("kind")
    except DuplicateKey as exc:
        raise FindingsError(
            f"findings file {path}: {exc.what}; surgery writes each key once, so the file was edited: recompute it"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        raise FindingsError(f"{path} is not a readable findings JSON file") from None
    if raw.get("format") == TUNE_FORMAT:
        return read_record(path)
    if raw.get("format") == RESULT_FORMAT:  # a common slip: "findings kind None" would not say it
        raise FindingsError(f"{path} is an eval result, not findings; give it as --eval {path}")
    if kind not in kinds():
        raise FindingsError(
            f"{path} has findings kind {kind!r}; surgery report reads {', '.join(kinds())} findings and tune records"
        )
    return load_findings(path, kind, finder(kind).record)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else "—" if v is None else str(v)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _pct(v: float | None) -> str:
    return "" if v is None else f"{v:.1f}%"


def _heads_section(f: HeadsFindings, stem: str, out: Path) -> list[str]:
    from . import plots

    # One bullet per statement: plain lines would run together into one markdown paragraph.
    lines = [f"## Attention heads — {f.model.path or '?'}", ""]
    disc = f.discovery
    selected = f.selected()
    if selected:
        lines.append("- Selected heads (layer.head): " + ", ".join(f"{l}.{h}" for l, h in selected))
    if disc and disc.auc is not None:
        lines.append(f"- Discovery AUC (grouped cross-validation): {_fmt(disc.auc)}")
    s = f.scores.S if f.scores else None
    if s and s.delta is not None:
        lines.append(
            f"- Binding effect ΔS = {_fmt(s.delta)} (match − mismatch; paired t-test over {_fmt(s.n_items)} items, "
            f"p = {_fmt(s.p)})"
        )
    ko = f.knockout.tested if f.knockout else None
    if ko and ko.effect_pct is not None:
        # A bootstrap without an interval records [nan, nan]: say nothing rather than "nan – nan"
        # (the caveat below says why there is none).
        ci = ko.ci95 if ko.ci95 and all(_finite(v) for v in ko.ci95) else None
        lines.append(
            f"- Edge knockout of the selected heads reduces |ΔS| by {_fmt(ko.effect_pct)}%"
            + (f" (95% CI {_fmt(ci[0])} – {_fmt(ci[1])})" if ci else "")
        )
    rnd = f.knockout.random if f.knockout else None
    if rnd and rnd.n and rnd.p is not None:
        lines.append(
            f"- Random head sets of the same size: {rnd.n} run, mean reduction {_pct(rnd.mean_pct) or '—'}; "
            f"p = {_fmt(rnd.p)} (Monte-Carlo; small p: the selected heads beat random heads)"
        )
    # The same caveats find-heads prints and the model card carries: a number without them overclaims.
    lines += [f"- **Caveat:** {c}" for c in caveats(f.summary())]
    lines.append("")
    if disc and disc.coef_grid:
        png = plots.head_heatmap(
            disc.coef_grid,
            out / f"{stem}-heads.png",
            marked=selected,
            title="L1 logistic-regression coefficient per head",
        )
        lines += [f"![head coefficients]({png.name})", ""]
    if f.dose_response:
        png = plots.dose_response(f.dose_response, out / f"{stem}-dose.png", awareness=f.awareness or ())
        lines += [f"![dose-response]({png.name})", "", "| α | ΔS edge | ΔS whole head |", "|---|---|---|"]
        lines += [f"| {_fmt(r.alpha)} | {_fmt(r.edge_delta_s)} | {_fmt(r.whole_delta_s)} |" for r in f.dose_response]
        lines.append("")
    return lines


def _neurons_section(f: NeuronsFindings, stem: str, out: Path) -> list[str]:
    from . import plots

    s = f.summary
    lines = [f"## MLP neurons — {f.model.path or '?'}", ""]
    if s and s.neurons:
        lines.append(
            f"Top {counted(s.n if s.n is not None else len(s.neurons), 'neuron')} by {s.score or '?'} ({s.rule or '?'} "
            f"selection); categories: {', '.join(s.categories or [])}"
        )
        # The columns find-neurons prints: the score the ranking is by among them, and under the
        # per-category rule the category whose turn chose the neuron (not its strongest one).
        per_category = s.rule == "per-category"
        lines += [
            "",
            f"| layer | neuron | bias | signed | fairness | PPM | {'chosen for' if per_category else 'top category'} |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r.layer} | {r.name} | {_fmt(r.bias)} | {_fmt(r.signed)} | {_fmt(r.fairness)} | {_fmt(r.ppm)} | "
            f"{(r.chosen_for if per_category else r.top_category) or ''} |"
            for r in s.neurons
        ]  # every one the header counts
        lines.append("")
    if s and s.layer_distribution:
        png = plots.layer_histogram(s.layer_distribution, out / f"{stem}-layers.png")
        lines += [f"![neurons per layer]({png.name})", ""]
    overlap = s.overlap if s else None
    if overlap and overlap.jaccard and len(overlap.categories) > 1:
        png = plots.overlap_matrix(overlap.categories, overlap.jaccard, out / f"{stem}-overlap.png")
        lines += [f"![category overlap]({png.name})", ""]
    return lines + _experts_lines(f.experts)


def _directions_section(f: DirectionsFindings, stem: str, out: Path) -> list[str]:
    from . import plots

    sides = (f.dataset.a, f.dataset.b) if f.dataset else (None, None)
    sizes = [counted(side.prompts, "prompt") if side else "? prompts" for side in sides]
    lines = [
        f"## Directions — {f.model.path or '?'}",
        "",
        f"mean(a) − mean(b) at the last prompt token after each layer; a: {sizes[0]}, b: {sizes[1]}; {f.best_words()}.",
        "",
    ]
    if f.layers:
        png = plots.direction_layers(f.layers, f.cosine or [[1.0]], out / f"{stem}-directions.png", best=f.best_layer)
        lines += [
            f"![directions per layer]({png.name})",
            "",
            "| layer | ‖direction‖ | separation (d) | accuracy |",
            "|---|---|---|---|",
        ]
        lines += [f"| {r.layer} | {_fmt(r.norm)} | {_fmt(r.separation)} | {_pct(100 * r.accuracy)} |" for r in f.layers]
        lines.append("")
    return lines


# What a tune's effect is, per method, as the front's axis and table say it.
TUNE_EFFECT = {
    "heads": "ΔS gain (S units)",
    "neurons": "pair bias removed (nats)",
    "direction": "marker rate removed",
}


def _tune_section(r: TuneRecord, stem: str, out: Path) -> list[str]:
    """The front with the chosen point and its held-out confirmation, and every front row."""
    from . import plots

    chosen, c = r.trial(r.chosen.number), r.confirmation
    effect = TUNE_EFFECT.get(r.method, "effect")
    rule = f"the largest effect with KL ≤ {r.chosen.max_kl:g}" if r.chosen.rule == "max_kl" else "the knee"
    lines = [
        f"## Tune ({r.method}) — {r.model.path or '?'}",
        "",
        f"{len(r.trials)} trials ({r.study.get('sampler')}, seed {r.split.seed}); {len(r.front)} on the Pareto front "
        f"of the tune split. Chosen: trial {chosen.number} ({rule}), {_params(chosen.params)}.",
        "",
        f"Held-out confirmation ({r.split.test_pairs} test {'prompts' if r.method == 'direction' else 'pairs'}, "
        f"{r.split.test_neutral} neutral prompts): "
        f"{effect} {_fmt(c.effect)} (95% CI {_fmt(c.effect_ci95[0])} – {_fmt(c.effect_ci95[1])}), "
        f"KL {_fmt(c.kl)} (95% CI {_fmt(c.kl_ci95[0])} – {_fmt(c.kl_ci95[1])}); on the tune split "
        f"{_fmt(chosen.effect)} and {_fmt(chosen.kl)}.",
        "",
    ]
    if not c.effect_ci95[0] > 0:  # as `surgery tune` notes and the baked card's caveat say
        lines += [
            "**Caveat:** the held-out effect's 95% CI does not lie above 0: the chosen edit is not shown to work "
            "on prompts the search never saw.",
            "",
        ]
    front = [r.trial(n) for n in r.front]
    png = plots.tune_front(
        [(t.kl, t.effect) for t in r.trials],
        [(t.kl, t.effect) for t in front],
        (chosen.kl, chosen.effect),
        (c.kl, c.effect, c.kl_ci95, c.effect_ci95),
        out / f"{stem}-front.png",
        effect_label=effect,
    )
    lines += [f"![Pareto front]({png.name})", "", f"| trial | parameters | {effect} | KL |", "|---|---|---|---|"]
    lines += [f"| {t.number} | {_params(t.params)} | {_fmt(t.effect)} | {_fmt(t.kl)} |" for t in front]
    return lines + [""]


def _params(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {_fmt(v)}" for k, v in params.items())


def _other_section(f: Findings, stem: str, out: Path) -> list[str]:
    """A finder without a section of its own: what it found on which model, with its parameters."""
    lines = [f"## {f.kind} findings ({finder(f.kind).find_command}) — {f.model.path or '?'}", ""]
    lines += [f"- {key}: {_fmt(value)}" for key, value in (f.parameters or {}).items()]
    return lines + [""]


# The section of each finder family's findings (see surgery.find.finders); others get _other_section.
SECTIONS = {"heads": _heads_section, "neurons": _neurons_section, "directions": _directions_section}


def _experts_lines(report: ExpertReport | None) -> list[str]:
    """Mixtures of experts: unscored neurons and the experts whose routing differs most per category."""
    if report is None:
        return []
    lines = [
        f"Experts: {report.experts} per layer × {report.expert_width} neurons"
        + (f", shared expert {report.shared_width}" if report.shared_width else "")
        + f"; {report.unscored_neurons} expert neurons unscored (no pair reached their expert).",
        "",
        "| category | layer | expert | routing share, stereotyped − other | mean abs difference |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {cat} | {r.layer} | {r.expert} | {_fmt(r.signed)} | {_fmt(r.mean_abs)} |"
        for cat, rows in report.routing.items()
        for r in rows
    ]
    return lines + [""]


def _eval_section(result: Mapping[str, Any], stem: str, out: Path) -> list[str]:
    from . import plots

    summary = card_summary(result)
    lines = [f"## Evaluation — {result['model'].get('path', '?')}", ""]
    if result.get("against"):
        lines.append(f"Compared with the source {result['against'].get('path')}.")
    lines += ["", "| metric | source | model | retained |", "|---|---|---|---|"]
    lines += [f"| {r.label} | {_fmt(r.before)} | {_fmt(r.after)} | {_pct(r.retained_pct)} |" for r in summary.rows]
    lines.append("")
    if result.get("against") and summary.rows:
        png = plots.before_after(summary.rows, out / f"{stem}-before-after.png")
        lines += [f"![before and after]({png.name})", ""]
    return lines


def build_report(findings: Iterable[Path], evals: Iterable[Path], out: Path, *, force: bool = False) -> Path:
    """Write ``out``/report.md and its PNGs; returns the report's path."""
    from .plots import pyplot

    pyplot()  # a missing matplotlib is reported before anything is read or written
    findings, evals = [Path(p) for p in findings], [Path(p) for p in evals]
    loaded = [(p, read_findings(p)) for p in findings]
    results = [(p, load_result(p)) for p in evals]
    with staged_output(Path(out), [], force) as tmp:
        lines = ["# surgery report", ""]
        for i, (path, f) in enumerate(loaded):
            stem = f"{i + 1:02d}-{path.stem}"
            lines += (
                _tune_section(f, stem, tmp)
                if isinstance(f, TuneRecord)
                else SECTIONS.get(f.kind, _other_section)(f, stem, tmp)
            )
        for i, (path, r) in enumerate(results):
            lines += _eval_section(r, f"eval{i + 1:02d}-{path.stem}", tmp)
        if not loaded and not results:
            lines.append("Nothing to report: give findings files and/or eval results.")
        (tmp / REPORT_NAME).write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
        manifest = {
            "format": "surgery-report",
            "version": 1,
            "tool_version": __version__,
            "findings": [str(p) for p in findings],
            "evals": [str(p) for p in evals],
            "files": hash_files(
                tmp, sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
            ),  # what --force may replace
        }
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return Path(out) / REPORT_NAME
