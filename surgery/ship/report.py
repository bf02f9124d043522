"""``surgery report``: one markdown page with figures from findings files and eval results.

Findings files (heads, neurons or directions, the common head of surgery.find.findings) and eval results
(``surgery eval --out``) are read as given; every section is drawn only when its data is present,
so a report of a partial run is still a valid report. The folder is written atomically.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from .. import __version__
from ..core.errors import FindingsError
from ..core.staging import staged_output
from ..core.strict_files import DuplicateKey, load_json
from ..evaluate.data import card_summary, load_result
from ..find.findings import KINDS, load_findings

REPORT_NAME = "report.md"
# What the report was drawn from; it marks the folder as surgery's (see surgery.core.staging).
MANIFEST_NAME = "surgery_report.json"


def read_findings(path: Path) -> dict[str, Any]:
    """A findings file of either kind (its 'kind' field says which)."""
    try:
        kind = load_json(Path(path).read_text(encoding="utf-8")).get("kind")
    except DuplicateKey as exc:
        raise FindingsError(f"findings file {path}: {exc.what}; surgery writes each key once, so the file "
                            "was edited: recompute it") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        raise FindingsError(f"{path} is not a readable findings JSON file") from None
    if kind not in KINDS:
        raise FindingsError(f"{path} has findings kind {kind!r}; surgery report reads {' and '.join(KINDS)} findings")
    return load_findings(path, kind)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else "—" if v is None else str(v)


def _pct(v: float | None) -> str:
    return "" if v is None else f"{v:.1f}%"


def _heads_section(f: Mapping[str, Any], stem: str, out: Path) -> list[str]:
    from . import plots

    lines = [f"## Attention heads — {f['model'].get('path', '?')}", ""]
    disc = f.get("discovery") or {}
    selected = f.get("selected_heads") or []
    if selected:
        lines.append("Selected heads (layer.head): " + ", ".join(f"{l}.{h}" for l, h in selected))
    if disc.get("auc") is not None:
        lines.append(f"Discovery AUC (grouped cross-validation): {_fmt(disc['auc'])}")
    ko = (f.get("knockout") or {}).get("tested") or {}
    if ko.get("effect_pct") is not None:
        lines.append(f"Edge knockout of the selected heads reduces |ΔS| by {_fmt(ko['effect_pct'])}%"
                     + (f" (95% CI {_fmt(ko['ci95'][0])} – {_fmt(ko['ci95'][1])})" if ko.get("ci95") else ""))
    lines.append("")
    if disc.get("coef_grid"):
        png = plots.head_heatmap(disc["coef_grid"], out / f"{stem}-heads.png", marked=selected,
                                 title="L1 logistic-regression coefficient per head")
        lines += [f"![head coefficients]({png.name})", ""]
    if f.get("dose_response"):
        png = plots.dose_response(f["dose_response"], out / f"{stem}-dose.png", awareness=f.get("awareness") or ())
        lines += [f"![dose-response]({png.name})", "", "| α | ΔS edge | ΔS whole head |", "|---|---|---|"]
        lines += [f"| {_fmt(r['alpha'])} | {_fmt(r.get('edge_delta_s'))} | {_fmt(r.get('whole_delta_s'))} |"
                  for r in f["dose_response"]]
        lines.append("")
    return lines


def _neurons_section(f: Mapping[str, Any], stem: str, out: Path) -> list[str]:
    from . import plots

    s = f.get("summary") or {}
    lines = [f"## MLP neurons — {f['model'].get('path', '?')}", ""]
    if s.get("neurons"):
        lines.append(f"Top {s.get('n', len(s['neurons']))} neurons by {s.get('score', '?')} ({s.get('rule', '?')} "
                     f"selection); categories: {', '.join(s.get('categories') or [])}")
        lines += ["", "| layer | neuron | bias | signed | top category |", "|---|---|---|---|---|"]
        lines += [f"| {r['layer']} | {r.get('label', r['neuron'])} | {_fmt(r.get('bias'))} | {_fmt(r.get('signed'))} | "
                  f"{r.get('top_category', '')} |" for r in s["neurons"]]  # every one the header counts
        lines.append("")
    if s.get("layer_distribution"):
        png = plots.layer_histogram(s["layer_distribution"], out / f"{stem}-layers.png")
        lines += [f"![neurons per layer]({png.name})", ""]
    overlap = s.get("overlap") or {}
    if overlap.get("jaccard") and len(overlap.get("categories") or []) > 1:
        png = plots.overlap_matrix(overlap["categories"], overlap["jaccard"], out / f"{stem}-overlap.png")
        lines += [f"![category overlap]({png.name})", ""]
    return lines + _experts_lines(f.get("experts"))


def _directions_section(f: Mapping[str, Any], stem: str, out: Path) -> list[str]:
    from . import plots

    rows, best = f.get("layers") or [], f.get("best_layer")
    data = f.get("dataset") or {}
    sizes = [(data.get(side) or {}).get("prompts") for side in ("a", "b")]
    lines = [f"## Directions — {f['model'].get('path', '?')}", "",
             f"mean(a) − mean(b) at the last prompt token after each layer; a: {sizes[0]} prompts, b: {sizes[1]}; "
             f"best separation at layer {best}.", ""]
    if rows:
        png = plots.direction_layers(rows, f.get("cosine") or [[1.0]], out / f"{stem}-directions.png", best=best)
        lines += [f"![directions per layer]({png.name})", "",
                  "| layer | ‖direction‖ | separation (d) | accuracy |", "|---|---|---|---|"]
        lines += [f"| {r['layer']} | {_fmt(r['norm'])} | {_fmt(r['separation'])} | {_pct(100 * r['accuracy'])} |"
                  for r in rows]
        lines.append("")
    return lines


SECTIONS = {"heads": _heads_section, "neurons": _neurons_section, "directions": _directions_section}


def _experts_lines(report: Mapping[str, Any] | None) -> list[str]:
    """Mixtures of experts: unscored neurons and the experts whose routing differs most per category."""
    if not report:
        return []
    lines = [f"Experts: {report['experts']} per layer × {report['expert_width']} neurons"
             + (f", shared expert {report['shared_width']}" if report.get("shared_width") else "")
             + f"; {report['unscored_neurons']} expert neurons unscored (no pair reached their expert).", "",
             "| category | layer | expert | routing share, stereotyped − other | mean abs difference |",
             "|---|---|---|---|---|"]
    lines += [f"| {cat} | {r['layer']} | {r['expert']} | {_fmt(r['signed'])} | {_fmt(r['abs'])} |"
              for cat, rows in report["routing"].items() for r in rows]
    return lines + [""]


def _eval_section(result: Mapping[str, Any], stem: str, out: Path) -> list[str]:
    from . import plots

    summary = card_summary(result)
    lines = [f"## Evaluation — {result['model'].get('path', '?')}", ""]
    if result.get("against"):
        lines.append(f"Compared with the source {result['against'].get('path')}.")
    lines += ["", "| metric | source | model | retained |", "|---|---|---|---|"]
    lines += [f"| {r['label']} | {_fmt(r['before'])} | {_fmt(r['after'])} | {_pct(r['retained_pct'])} |"
              for r in summary["rows"]]
    lines.append("")
    if result.get("against") and summary["rows"]:
        png = plots.before_after(summary["rows"], out / f"{stem}-before-after.png")
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
            lines += SECTIONS[f["kind"]](f, stem, tmp)
        for i, (path, r) in enumerate(results):
            lines += _eval_section(r, f"eval{i + 1:02d}-{path.stem}", tmp)
        if not loaded and not results:
            lines.append("Nothing to report: give findings files and/or eval results.")
        (tmp / REPORT_NAME).write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
        manifest = {"format": "surgery-report", "version": 1, "tool_version": __version__,
                    "findings": [str(p) for p in findings], "evals": [str(p) for p in evals]}
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return Path(out) / REPORT_NAME
