"""Head commands: score-binding, find-heads, amplify-heads."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from .. import api
from ..api.params import PAIR_FIELDS, SEARCH_FIELDS, FindParams, LoadSpec
from ..api.records import BindingScores, Confirmation, HeadsFindings, delta_s_caveat, weak_heads_caveat
from ..core.counted import counted
from .baking import bake_settings, each_line, parse_values, print_result
from .console import both_progress, note, out, print_json, print_table, progress_bars
from .group import cli
from .options import RECOMPUTE, baking_command, findings_options, model_argument, typed_options


def _fmt(x: Any, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _ci(ci95: list | None) -> str:
    lo, hi = (list(ci95 or []) + [None, None])[:2]
    return f"[{_fmt(lo, 1)}, {_fmt(hi, 1)}]"


def print_scores(scores: BindingScores) -> None:
    table = Table(title="Binding scores: mean S and K, Δ = match − mismatch, paired t-test over items")
    for col in ("", "Δ", "match", "mismatch", "t", "p", "pairs", "items", "option mass"):
        table.add_column(col)
    for name, d in (("S", scores.S), ("K", scores.K)):
        table.add_row(
            name,
            _fmt(d.delta, 4),
            _fmt(d.mean_match),
            _fmt(d.mean_mismatch),
            _fmt(d.t, 2),
            _fmt(d.p),
            str(d.n_pairs),
            str(d.n_items),
            _fmt(d.option_mass),
        )
    print_table(table)
    out.print(f"|ΔK| / |ΔS| = {_fmt(scores.K_over_S, 2)}")
    # What the columns mean (docs/methods/binding-heads.md): the numbers alone do not say it.
    out.print(
        "S: log-odds of the equal-treatment option (c) against (a)/(b), in nats; ΔS < 0: the model "
        "differentiates more when the related identity is present. K: the same score on the knowledge "
        "probe (which identity is associated with the item); |ΔK| / |ΔS|: how much more it knows than it "
        "acts on. option mass: the share of probability on the option letters (near 0: it does not "
        "answer with a letter)."
    )


def print_confirmation(conf: Confirmation, selected: list[tuple[int, int]]) -> None:
    """The single-head knockouts of the heads put forward, in the order the selection uses; with the
    screen, its estimate of each and its rank correlation with the exact effects."""
    screened = any(h.screen_rank is not None for h in conf.heads)
    which = (
        f"{conf.candidates} of discovery's top heads knocked out alone, in the screen's order"
        if screened
        else f"discovery's top {counted(conf.candidates, 'head')} knocked out alone"
    )
    table = Table(title=f"Knockout confirmation: each of {which}; significant = 95% CI above 0")
    cols = ["head", "disc. rank"] + (["screen rank", "screened %"] if screened else [])
    for col in cols + ["coef", "reduction %", "95% CI", "signif.", "selected"]:
        table.add_column(col, no_wrap=True)
    chosen = set(selected)
    for h in conf.heads:
        screen = [str(h.screen_rank), _fmt(h.screen_effect_pct, 1)] if screened else []
        table.add_row(
            f"{h.layer}.{h.head}",
            str(h.discovery_rank),
            *screen,
            _fmt(h.coef),
            _fmt(h.effect_pct, 1),
            _ci(h.ci95),
            "yes" if h.significant else "no",
            "✓" if (h.layer, h.head) in chosen else "",
        )
    print_table(table)
    if screened:
        out.print(
            f"Attribution-patching screen: Spearman {_fmt(conf.spearman, 2)} between screened and exact "
            f"effects of these {counted(conf.candidates, 'head')}"
        )
    caveat = weak_heads_caveat(max(0, len(selected) - conf.n_significant), len(selected))
    if caveat:
        note(caveat)


def print_findings(f: HeadsFindings) -> None:
    print_scores(f.scores)
    disc = f.discovery
    out.print(
        f"Discovery: CV AUC {_fmt(disc.auc)} ({disc.folds} folds by item); "
        f"stable heads {', '.join(f'{l}.{h}' for l, h in disc.stable_heads or []) or 'none'}"
    )
    top = Table(title="Discovery ranking (stability across folds, then |coef|)")
    for col in ("head", "stability", "coef"):
        top.add_column(col)
    for h in disc.heads[:10]:
        top.add_row(f"{h.layer}.{h.head}", _fmt(h.stability, 2), _fmt(h.coef))
    print_table(top)
    if f.confirmation:
        print_confirmation(f.confirmation, f.selected())
    ko = f.knockout
    table = Table(title=f"Edge knockout of {', '.join(f'{l}.{h}' for l, h in f.selected())}")
    for col in ("edges from", "ΔS base", "ΔS knockout", "reduction %", "95% CI"):
        table.add_column(col)
    for label, r in (("tested identity", ko.tested), ("distractor (control)", ko.control)):
        table.add_row(label, _fmt(r.delta_base, 4), _fmt(r.delta_knockout, 4), _fmt(r.effect_pct, 1), _ci(r.ci95))
    rnd = ko.random
    table.add_row(
        f"random heads ×{rnd.n}",
        "",
        "",
        f"{_fmt(rnd.mean_pct, 1)} ± {_fmt(rnd.sd_pct, 1)}",
        f"share ≥ tested {_fmt(rnd.share_ge_tested, 2)}" + (f", p {_fmt(rnd.p, 3)}" if rnd.p is not None else ""),
    )
    print_table(table)
    if rnd.stopped:
        out.print(f"Random sets: {rnd.n} of at most {rnd.cap} ({rnd.stopped}); p {_fmt(rnd.p, 3)}")
    caveat = delta_s_caveat(f.scores.S.p)
    if caveat:
        note(caveat)
    if f.dose_response:
        dose = Table(
            title="Dose-response: edge-level α (paper, run time only) vs whole-head α (bakeable); "
            "DiffAware / CtxtAware by greedy generation"
        )
        cols = ["α", "ΔS edge", "ΔS whole"]
        aw = {r.alpha: r for r in f.awareness or []}
        if aw:
            cols += ["DiffA edge", "DiffA whole", "CtxtA edge", "CtxtA whole"]
        for col in cols:
            dose.add_column(col)
        by_alpha = {r.alpha: r for r in f.dose_response}
        for alpha in sorted(set(by_alpha) | set(aw)):
            r = by_alpha.get(alpha)
            row = [f"{alpha:g}", _fmt(r.edge_delta_s if r else None, 4), _fmt(r.whole_delta_s if r else None, 4)]
            if aw:
                a = aw.get(alpha)
                row += (
                    [_fmt(a.edge.diffaware), _fmt(a.whole.diffaware), _fmt(a.edge.ctxtaware), _fmt(a.whole.ctxtaware)]
                    if a
                    else [""] * 4
                )
            dose.add_row(*row)
        print_table(dose)


@cli.command(name="score-binding")
@model_argument
@typed_options(FindParams, into="params", only=PAIR_FIELDS)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def score_binding_cmd(model: str, load: LoadSpec, params: FindParams, as_json: bool) -> None:
    """Print ΔS and ΔK (paired t-tests over items) of MODEL on the binding benchmark."""
    with progress_bars() as progress:  # stderr, with --json too (it owns stdout only)
        result = api.score_binding(model, load=load, params=params, progress=progress)
    if as_json:
        print_json(result.to_dict())
    else:
        print_scores(result)


@cli.command(name="find-heads")
@model_argument
@typed_options(FindParams, into="params")
@RECOMPUTE
@click.option(
    "--out",
    "out_file",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write the findings JSON here (they are always cached).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the findings JSON.")
def find_heads_cmd(
    model: str, load: LoadSpec, params: FindParams, recompute: bool, out_file: Path | None, as_json: bool
) -> None:
    """Find cultural binding heads of MODEL: scores with an attribution-patching screen, discovery,
    knockout confirmation, knockout (cached findings)."""
    with progress_bars() as progress:  # stderr, with --json too
        found = api.find_heads(
            model, recompute=recompute, out=out_file, load=load, params=params, progress=progress, report=note
        )
    findings, path, cached = found.data, found.path, found.from_cache
    if as_json:
        print_json(findings.to_dict())
        return
    print_findings(findings)
    out.print(f"{'Cached' if cached else 'Saved'} findings: {path}" + (f" and {out_file}" if out_file else ""))


@cli.command(name="amplify-heads")
@baking_command
@click.option(
    "--heads",
    default=None,
    help="Heads as LAYER.HEAD pairs, e.g. 7.7,8.17 (0-based); without it the heads come from findings.",
)
@click.option(
    "--alpha",
    "alphas",
    required=True,
    help="Scale of each head's output (2.5 amplifies); a list (2,2.5,3) bakes one folder per value.",
)
@click.option(
    "--allow-zero",
    is_flag=True,
    help="Accept --alpha 0, or an α that rounds the heads' weights to zero in the stored dtype (removes the heads).",
)
@findings_options("heads")
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=None,
    help="How many heads from the findings (default: the knocked-out selection); beyond "
    "it, heads follow the knockout-confirmed ranking, then discovery's.",
)
@typed_options(FindParams, into="params", only=(*PAIR_FIELDS, *SEARCH_FIELDS, "keep_memory"), optional=True)
def amplify_heads(
    model: str,
    load: LoadSpec,
    out_dir: Path,
    force: bool,
    verify: bool,
    as_json: bool,
    heads: str | None,
    alphas: str,
    allow_zero: bool,
    source: api.FindingsSource,
    top: int | None,
    params: FindParams | None,
) -> None:
    """Scale the o_proj input columns of chosen heads by ALPHA and write a new checkpoint."""

    def show(plans: list[api.Planned]) -> None:  # the heads the findings gave, before they are baked
        record = (plans[0].extra or {}).get("heads_findings")
        if record and not as_json:
            out.print(f"Heads from findings ({record['file']}): {', '.join(f'{la}.{h}' for la, h in record['heads'])}")

    with both_progress() as (progress, stages):  # stderr, with --json too
        result = api.amplify_heads(
            model,
            out_dir,
            alpha=parse_values(alphas, "alpha"),
            heads=heads,
            top=top,
            source=source,
            bake=bake_settings(force, verify, allow_zero=allow_zero),
            load=load,
            params=params,
            callbacks=api.Callbacks(
                progress=progress, stages=stages, report=note, on_plans=show, on_each=each_line(as_json)
            ),
        )
    print_result(result, as_json)
