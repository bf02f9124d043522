"""Figures for reports (optional extra ``llm-surgery[plots]``: matplotlib, drawn off-screen).

Each function takes plain data (lists of numbers, the typed rows of findings and eval results),
writes one PNG and returns its path. Nothing here reads files or decides what to plot:
surgery.ship.report does that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.finite_json import number
from ..core.optional import require

if TYPE_CHECKING:
    from ..core.evaluation_table import EvaluationRow
    from ..find.directions.record import LayerDirection
    from ..find.heads.record import AwarenessPoint, DosePoint

DPI = 110


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (no display needed)."""
    matplotlib = require("matplotlib")
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    path = Path(path)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    pyplot().close(fig)
    return path


def _integer_ticks(ax) -> None:
    """Layers, heads and counts are whole numbers: no 0.5 ticks."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def head_heatmap(
    grid: Sequence[Sequence[float]],
    path: Path,
    *,
    title: str = "Head coefficients",
    marked: Sequence[Sequence[int]] = (),
) -> Path:
    """Layers × heads heatmap of a per-head score (diverging colours around 0); ``marked`` heads boxed."""
    plt = pyplot()
    grid = [[number(v) for v in row] for row in grid]  # a missing coefficient (null in the file) is blank
    rows, cols = len(grid), len(grid[0]) if grid else 0
    fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * cols + 2), max(3.0, 0.25 * rows + 1.5)))
    peak = max((abs(v) for row in grid for v in row if math.isfinite(v)), default=1.0) or 1.0
    image = ax.imshow(grid, cmap="RdBu_r", vmin=-peak, vmax=peak, aspect="auto", origin="lower")
    for layer, head in marked:
        ax.add_patch(plt.Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.5))
    _integer_ticks(ax)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, shrink=0.8)
    return _save(fig, path)


def dose_response(
    rows: Sequence[DosePoint],
    path: Path,
    *,
    awareness: Sequence[AwarenessPoint] = (),
    title: str = "Dose-response: edge-α vs whole-head α",
) -> Path:
    """ΔS against α for edge-level and whole-head scaling; DiffAware/CtxtAware in a second panel."""
    plt = pyplot()
    panels = 2 if awareness else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4), squeeze=False)
    ax = axes[0][0]
    alphas = [r.alpha for r in rows]
    ax.plot(alphas, [r.edge_delta_s for r in rows], "o-", label="edge-α (identity→item edges)")
    ax.plot(alphas, [r.whole_delta_s for r in rows], "s--", label="whole-head α (o_proj slice)")
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("α")
    ax.set_ylabel("ΔS (match − mismatch)")
    ax.set_title(title)
    ax.legend()
    if awareness:
        ax = axes[0][1]
        a = [r.alpha for r in awareness]
        for mode, style in (("edge", "-"), ("whole", "--")):
            for metric, marker in (("diffaware", "o"), ("ctxtaware", "s")):
                ys = [getattr(getattr(r, mode), metric) for r in awareness]
                if any(y is not None for y in ys):
                    ax.plot(a, ys, marker + style, label=f"{metric} ({mode})")
        ax.set_xlabel("α")
        ax.set_ylabel("accuracy")
        ax.set_title("DiffAware / CtxtAware")
        ax.legend(fontsize=8)
    return _save(fig, path)


def layer_histogram(counts: Sequence[int], path: Path, *, title: str = "Selected neurons per layer") -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4.0, 0.25 * len(counts) + 2), 3.2))
    ax.bar(range(len(counts)), counts, color="tab:orange")
    _integer_ticks(ax)
    ax.set_xlabel("layer")
    ax.set_ylabel("neurons")
    ax.set_title(title)
    return _save(fig, path)


def direction_layers(
    rows: Sequence[LayerDirection], cosine: Sequence[Sequence[float]], path: Path, *, best: int | None = None
) -> Path:
    """Direction findings: each layer's separation and the direction's norm (left), and the cosine
    between every two layers' directions (right)."""
    plt = pyplot()
    n = len(rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(8.0, 0.3 * n + 5), 3.6))
    layers = [r.layer for r in rows]
    left.plot(layers, [r.separation for r in rows], marker="o", color="tab:blue", label="separation (d)")
    left.set_xlabel("layer")
    left.set_ylabel("separation (Cohen's d)")
    norms = left.twinx()
    norms.plot(layers, [r.norm for r in rows], color="tab:grey", linestyle="--", label="‖direction‖")
    norms.set_ylabel("‖mean a − mean b‖")
    if best is not None:
        left.axvline(best, color="tab:red", linewidth=0.8)
    _integer_ticks(left)
    image = right.imshow(cosine, cmap="RdBu_r", vmin=-1, vmax=1, origin="lower")
    _integer_ticks(right)
    right.set_xlabel("layer")
    right.set_ylabel("layer")
    right.set_title("cosine between layers' directions", fontsize=9)
    fig.colorbar(image, ax=right, shrink=0.8)
    return _save(fig, path)


def overlap_matrix(
    categories: Sequence[str],
    matrix: Sequence[Sequence[float]],
    path: Path,
    *,
    title: str = "Category overlap (Jaccard of top-n sets)",
) -> Path:
    plt = pyplot()
    n = len(categories)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * n + 2), max(3.5, 0.8 * n + 1.5)))
    image = ax.imshow(matrix, cmap="viridis", vmin=0, vmax=1)
    ax.set_xticks(range(n), categories, rotation=45, ha="right")
    ax.set_yticks(range(n), categories)
    for i in range(n):
        for j in range(n):
            ax.text(
                j,
                i,
                f"{matrix[i][j]:.2f}",
                ha="center",
                va="center",
                color="white" if matrix[i][j] < 0.6 else "black",
                fontsize=8,
            )
    ax.set_title(title)
    fig.colorbar(image, ax=ax, shrink=0.8)
    return _save(fig, path)


def before_after(rows: Sequence[EvaluationRow], path: Path, *, title: str = "Before / after") -> Path:
    """One small panel per metric: source vs edited (metrics have different scales)."""
    plt = pyplot()
    rows = [r for r in rows if r.after is not None]
    cols = min(4, max(1, len(rows)))
    lines = max(1, math.ceil(len(rows) / cols))
    fig, axes = plt.subplots(lines, cols, figsize=(3.2 * cols, 2.8 * lines), squeeze=False)
    for ax, r in zip([a for line in axes for a in line], rows):
        values = [r.before, r.after]
        ax.bar(["source", "edited"], [v if v is not None else 0 for v in values], color=["tab:grey", "tab:blue"])
        ax.set_title(r.label, fontsize=8)
    for ax in [a for line in axes for a in line][len(rows) :]:
        ax.axis("off")
    fig.suptitle(title)
    return _save(fig, path)


def tune_front(
    trials: Sequence[tuple[float, float]],
    front: Sequence[tuple[float, float]],
    chosen: tuple[float, float],
    confirmed: tuple[float, float, Sequence[float], Sequence[float]],
    path: Path,
    *,
    effect_label: str,
) -> Path:
    """Every trial as (KL, effect), the Pareto front as a line, the chosen point, and its held-out
    confirmation (KL, effect, KL CI, effect CI) as a point with 95% error bars. KL on a log axis
    when every KL is positive (they span orders of magnitude)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.scatter([k for k, _ in trials], [e for _, e in trials], s=14, color="0.6", label="trials (tune split)")
    ax.plot([k for k, _ in front], [e for _, e in front], "-o", color="tab:blue", ms=4, label="Pareto front")
    ax.scatter([chosen[0]], [chosen[1]], s=120, marker="*", color="tab:red", zorder=3, label="chosen")
    kl, effect, kl_ci, effect_ci = confirmed
    ax.errorbar(
        [kl],
        [effect],
        xerr=[[kl - kl_ci[0]], [kl_ci[1] - kl]],
        yerr=[[effect - effect_ci[0]], [effect_ci[1] - effect]],
        fmt="s",
        color="tab:green",
        capsize=3,
        label="chosen, held-out (95% CI)",
    )
    if all(k > 0 for k, _ in trials) and kl_ci[0] > 0:
        ax.set_xscale("log")
    ax.set_xlabel("first-token KL on neutral prompts (nats)")
    ax.set_ylabel(effect_label)
    ax.legend(fontsize="small")
    ax.set_title("surgery tune: effect against cost")
    return _save(fig, path)
