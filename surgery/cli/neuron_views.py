"""What find-neurons / prune-neurons show and record: neuron table, layer histogram, overlap matrix."""

from __future__ import annotations

from rich.table import Table

from ..api.records import CategoryOverlap, ExpertReport, NeuronsDataset, NeuronSelection
from ..core.counted import counted
from .console import out, print_table

BAR_WIDTH = 30


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def neuron_table(summary: NeuronSelection, title: str) -> Table:
    """Selected neurons; 'category' is the one that chose it (per-category) or its strongest one."""
    per_category = summary.rule == "per-category"
    table = Table(title=title)
    for col in ("#", "layer", "neuron", "bias", "signed", "fairness", "PPM", "activation"):
        table.add_column(col, justify="right")
    table.add_column("chosen for" if per_category else "top category")
    for rank, r in enumerate(summary.neurons or [], 1):
        table.add_row(
            str(rank),
            str(r.layer),
            r.name,
            _fmt(r.bias),
            _fmt(r.signed),
            _fmt(r.fairness),
            _fmt(r.ppm),
            _fmt(r.activation),
            r.chosen_for if per_category else r.top_category,
        )
    return table


def histogram_lines(distribution: list[int]) -> list[str]:
    """One bar per layer that holds a selected neuron."""
    peak = max(distribution) or 1
    return [
        f"layer {layer:>3} {'█' * max(1, round(BAR_WIDTH * c / peak)):<{BAR_WIDTH}} {c}"
        for layer, c in enumerate(distribution)
        if c
    ]


def overlap_table(overlap: CategoryOverlap) -> Table:
    cats = overlap.categories
    table = Table(title=f"Category overlap: Jaccard of each category's top {overlap.n} ({overlap.score})")
    table.add_column("")
    for c in cats:
        table.add_column(c, justify="right")
    for c, row in zip(cats, overlap.jaccard):
        table.add_row(c, *(f"{v:.2f}" for v in row))
    return table


def print_experts(report: ExpertReport) -> None:
    """Mixtures of experts: unscored neurons, and the experts whose routing differs most per category."""
    out.print(
        f"Experts: {report.experts} per layer × {report.expert_width} neurons"
        + (f", shared expert {report.shared_width}" if report.shared_width else "")
        + f"; {report.unscored_neurons} expert neurons unscored (no pair reached their expert)"
    )
    table = Table(title="Routing share, stereotyped − other side (mean over pairs)")
    for col in ("category", "layer", "expert", "signed", "mean |Δ|"):
        table.add_column(col, justify="right" if col != "category" else "left")
    for cat, rows in report.routing.items():
        for r in rows:
            table.add_row(cat, str(r.layer), str(r.expert), _fmt(r.signed), _fmt(r.mean_abs))
    print_table(table)


def print_summary(summary: NeuronSelection, dataset: NeuronsDataset | None, title: str = "") -> None:
    """The rich view of one selection (find-neurons shows the top n; prune-neurons what it bakes)."""
    head = (
        f"Top {counted(summary.n, 'neuron')} by {summary.score} ({summary.rule}"
        + (f", w = {summary.bias_weight:g}" if summary.score == "fairness" else "")
        + (f", sparing the {summary.spare_active:g} most active per layer" if summary.spare_active else "")
        + ")"
    )
    print_table(neuron_table(summary, f"{head}{' — ' + title if title else ''}"))
    out.print("[bold]Neurons per layer[/]")
    for line in histogram_lines(summary.layer_distribution or []):
        out.print(line)
    if summary.overlap and len(summary.overlap.categories) > 1:
        print_table(overlap_table(summary.overlap))
    if dataset:
        skipped = dataset.skipped or {}
        note = (
            f"; skipped (token counts differ): {', '.join(f'{c} {k}' for c, k in skipped.items())}" if skipped else ""
        )
        out.print(f"Pairs: {dataset.pairs_used} of {dataset.pairs} from {dataset.source}{note}")
