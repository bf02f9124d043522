"""Head commands: score-binding, find-heads, amplify-heads."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from ..core.distributed import is_main
from ..core.edits import HeadScale, Recipe, parse_heads
from ..core.errors import RecipeError
from ..find.heads.caveats import delta_s_caveat, weak_heads_caveat
from ..find.heads.params import PAIR_FIELDS, SEARCH_FIELDS, FindParams
from ..find.heads.record import BindingScores, Confirmation, HeadsFindings
from ..model.loading import LoadSpec
from .baking import bake_each, parse_values, sweep_label
from .console import note, out, print_json, progress_bars
from .group import cli
from .options import baking_command, model_argument, typed_options

def check_alpha(alpha: float, allow_zero: bool) -> None:
    if not math.isfinite(alpha):
        raise RecipeError(f"--alpha must be a finite number, got {alpha}")
    if alpha == 0 and not allow_zero:
        raise RecipeError("--alpha 0 does not amplify: it silences the heads entirely (ablation); "
                          "pass --allow-zero if that is what you want")


RECOMPUTE = click.option("--recompute", is_flag=True, help="Ignore cached findings.")


def _pairs(params: FindParams):
    from ..find.heads.benchmark import load_benchmark
    from ..find.heads.pairs import build_pairs

    bench = load_benchmark(params.benchmark)
    pairs = build_pairs(bench, seed=params.seed, per_identity=params.per_identity, max_pairs=params.max_pairs)
    return bench, pairs


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
        table.add_row(name, _fmt(d.delta, 4), _fmt(d.mean_match), _fmt(d.mean_mismatch), _fmt(d.t, 2),
                      _fmt(d.p), str(d.n_pairs), str(d.n_items), _fmt(d.option_mass))
    out.print(table)
    out.print(f"|ΔK| / |ΔS| = {_fmt(scores.K_over_S, 2)}")


def print_confirmation(conf: Confirmation, selected: list[tuple[int, int]]) -> None:
    """The single-head knockouts of discovery's candidates, in the order the selection uses."""
    table = Table(title=f"Knockout confirmation: each of discovery's top {conf.candidates} heads alone; "
                        "significant = 95% CI above 0")
    for col in ("head", "disc. rank", "coef", "reduction %", "95% CI", "signif.", "selected"):
        table.add_column(col, no_wrap=True)
    chosen = set(selected)
    for h in conf.heads:
        table.add_row(f"{h.layer}.{h.head}", str(h.discovery_rank), _fmt(h.coef), _fmt(h.effect_pct, 1),
                      _ci(h.ci95), "yes" if h.significant else "no", "✓" if (h.layer, h.head) in chosen else "")
    out.print(table)
    caveat = weak_heads_caveat(max(0, len(selected) - conf.n_significant), len(selected))
    if caveat:
        note(caveat)


def print_findings(f: HeadsFindings) -> None:
    print_scores(f.scores)
    disc = f.discovery
    out.print(f"Discovery: CV AUC {_fmt(disc.auc)} ({disc.folds} folds by item); "
              f"stable heads {', '.join(f'{l}.{h}' for l, h in disc.stable_heads or []) or 'none'}")
    top = Table(title="Discovery ranking (stability across folds, then |coef|)")
    for col in ("head", "stability", "coef"):
        top.add_column(col)
    for h in disc.heads[:10]:
        top.add_row(f"{h.layer}.{h.head}", _fmt(h.stability, 2), _fmt(h.coef))
    out.print(top)
    if f.confirmation:
        print_confirmation(f.confirmation, f.selected())
    ko = f.knockout
    table = Table(title=f"Edge knockout of {', '.join(f'{l}.{h}' for l, h in f.selected())}")
    for col in ("edges from", "ΔS base", "ΔS knockout", "reduction %", "95% CI"):
        table.add_column(col)
    for label, r in (("tested identity", ko.tested), ("distractor (control)", ko.control)):
        table.add_row(label, _fmt(r.delta_base, 4), _fmt(r.delta_knockout, 4), _fmt(r.effect_pct, 1), _ci(r.ci95))
    rnd = ko.random
    table.add_row(f"random heads ×{rnd.n}", "", "", f"{_fmt(rnd.mean_pct, 1)} ± {_fmt(rnd.sd_pct, 1)}",
                  f"share ≥ tested {_fmt(rnd.share_ge_tested, 2)}")
    out.print(table)
    caveat = delta_s_caveat(f.scores.S.p)
    if caveat:
        note(caveat)
    if f.dose_response:
        dose = Table(title="Dose-response: edge-level α (paper, run time only) vs whole-head α (bakeable); "
                           "DiffAware / CtxtAware by greedy generation")
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
                row += ([_fmt(a.edge.diffaware), _fmt(a.whole.diffaware),
                         _fmt(a.edge.ctxtaware), _fmt(a.whole.ctxtaware)] if a else [""] * 4)
            dose.add_row(*row)
        out.print(dose)


@cli.command(name="score-binding")
@model_argument
@typed_options(FindParams, into="params", only=PAIR_FIELDS)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def score_binding_cmd(model: str, load: LoadSpec, params: FindParams, as_json: bool) -> None:
    """Print ΔS and ΔK (paired t-tests over items) of MODEL on the binding benchmark."""
    from ..bake.patches import check_loadable
    from ..core import distributed
    from ..find.heads.attention import surgery_attention_on
    from ..find.heads.find import pairs_sha256
    from ..find.heads.scores import score_binding
    from ..model.loading import load_model, load_tokenizer, open_checkpoint

    ckpt, _ = open_checkpoint(model, load)
    check_loadable(ckpt)
    bench, pairs = _pairs(params)
    distributed.check_agree("the model and the pairs", ckpt.fingerprint(), pairs_sha256(pairs), params.to_dict())
    tok = load_tokenizer(ckpt.path, load)
    net = load_model(ckpt.path, load)
    # progress goes to stderr, with --json too (it owns stdout only)
    with surgery_attention_on(net), progress_bars() as progress:
        res = score_binding(net, tok, pairs, instruct=params.instruct, batch_size=params.batch_size,
                            progress=progress("scoring prompts", 4 * len(pairs)))
    scores = BindingScores.of(res)
    if as_json:
        print_json({"S": scores.S.to_dict(), "K": scores.K.to_dict(), "K_over_S": scores.K_over_S,
                    "benchmark": bench.source, "benchmark_sha256": bench.sha256})
    else:
        print_scores(scores)


def _find(ckpt, load: LoadSpec, params: FindParams, recompute: bool):
    """Cached or fresh head findings of ``ckpt`` (progress on stderr, with --json too)."""
    from ..find.heads.benchmark import benchmark_awareness_records
    from ..find.heads.find import cached_find_heads

    bench, pairs = _pairs(params)
    params = replace(params, extra={"benchmark_sha256": bench.sha256})
    records = benchmark_awareness_records(bench, params.seed) if params.dose_response else None
    with progress_bars() as progress:
        return cached_find_heads(ckpt, pairs, params, recompute=recompute, load=load,
                                 awareness_records=records, progress=progress,
                                 report=note)


@cli.command(name="find-heads")
@model_argument
@typed_options(FindParams, into="params")
@RECOMPUTE
@click.option("--out", "out_file", type=click.Path(path_type=Path), default=None,
              help="Also write the findings JSON here (they are always cached).")
@click.option("--json", "as_json", is_flag=True, help="Print the findings JSON.")
def find_heads_cmd(model: str, load: LoadSpec, params: FindParams, recompute: bool, out_file: Path | None,
                   as_json: bool) -> None:
    """Find cultural binding heads of MODEL: scores, discovery, knockout confirmation, knockout
    (cached findings)."""
    from ..find.findings import save_findings
    from ..model.loading import open_checkpoint

    ckpt, _ = open_checkpoint(model, load)
    found = _find(ckpt, load, params, recompute)
    findings, path, cached = found.data, found.path, found.from_cache
    if out_file and is_main():  # under torchrun rank 0 alone writes
        save_findings(findings, out_file)
    if as_json:
        print_json(findings.to_dict())
        return
    print_findings(findings)
    out.print(f"{'Cached' if cached else 'Saved'} findings: {path}" + (f" and {out_file}" if out_file else ""))


@cli.command(name="amplify-heads")
@baking_command
@click.option("--heads", default=None, help="Heads as LAYER.HEAD pairs, e.g. 7.7,8.17 (0-based); "
              "without it the heads come from findings.")
@click.option("--alpha", "alphas", required=True,
              help="Scale of each head's output (2.5 amplifies); a list (2,2.5,3) bakes one folder per value.")
@click.option("--allow-zero", is_flag=True, help="Accept --alpha 0, or an α that rounds the heads' weights to "
              "zero in the stored dtype (removes the heads).")
@click.option("--findings", "findings_file", type=click.Path(path_type=Path), default=None,
              help="A heads findings file (default: cached findings for MODEL, computed if missing).")
@click.option("--top", type=click.IntRange(min=1), default=None,
              help="How many heads from the findings (default: the knocked-out selection); beyond "
              "it, heads follow the knockout-confirmed ranking, then discovery's.")
@click.option("--transfer", is_flag=True,
              help="Accept findings from another checkpoint of the same architecture (instruct → base).")
@typed_options(FindParams, into="params", only=PAIR_FIELDS + SEARCH_FIELDS)
@RECOMPUTE
def amplify_heads(model: str, load: LoadSpec, out_dir: Path, force: bool, verify: bool, as_json: bool,
                  heads: str | None, alphas: str, allow_zero: bool, findings_file: Path | None, top: int | None,
                  transfer: bool, params: FindParams, recompute: bool) -> None:
    """Scale the o_proj input columns of chosen heads by ALPHA and write a new checkpoint."""
    values = parse_values(alphas, "--alpha")
    for alpha in values:
        check_alpha(alpha, allow_zero)
    extra = None
    if heads is not None:  # `--heads ""` is an empty list (parse_heads says so), not "use findings"
        if findings_file or top or transfer:
            raise RecipeError("--heads names the heads itself; drop --findings / --top / --transfer, or drop --heads")
        chosen = [(h.layer, h.head) for h in parse_heads(heads, 1.0)]
    else:
        chosen, extra = _heads_from_findings(model, load, findings_file, top, transfer, params, recompute, as_json)
    recipes = [Recipe(tuple(HeadScale(layer, head, a) for layer, head in chosen)) for a in values]
    items = [(sweep_label("alpha", a), r, extra) for a, r in zip(values, recipes)]
    bake_each(model, items, out_dir, load=load, force=force, verify=verify, as_json=as_json, allow_zero=allow_zero)


def _heads_from_findings(model: str, load: LoadSpec, findings_file: Path | None, top: int | None, transfer: bool,
                         params: FindParams, recompute: bool, as_json: bool):
    """The heads to amplify from --findings or the cached (else fresh) findings, and their record."""
    from ..find.heads.find import HeadFindings
    from ..model.loading import open_checkpoint

    ckpt, _ = open_checkpoint(model, load)
    if findings_file:
        found = HeadFindings.read(findings_file, ckpt, transfer)
        if found.transfer_note:
            note(found.transfer_note)
    elif transfer:  # as prune-neurons: cached findings are this model's, there is nothing to transfer
        raise RecipeError("--transfer applies to --findings from another checkpoint; give --findings FILE")
    else:
        found = _find(ckpt, load, params, recompute)
    chosen = found.select(top)
    if not as_json:
        out.print(f"Heads from findings ({found.path}): {', '.join(f'{l}.{h}' for l, h in chosen)}")
    return chosen, {"heads_findings": {**found.record(), "heads": [list(h) for h in chosen]}}
