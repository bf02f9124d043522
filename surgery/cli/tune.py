"""The tune command: search an edit's parameters on a measured Pareto front, confirm on held-out prompts."""

from __future__ import annotations

import math
from pathlib import Path

import click
from rich.table import Table

from .. import api
from ..api.params import CaptureParams, FindParams, LoadSpec, TuneParams
from ..api.records import Trial, TuneRecord
from .baking import bake_settings, print_baked
from .console import note, out, print_json, print_table, progress_bars
from .group import cli
from .options import model_argument, typed_options

# The binding pairs' fields that tune offers (their seed and batch size are the tune's own), and the
# fairness pairs' (--method neurons).
PROMPT_FIELDS = ("benchmark", "max_pairs", "per_identity", "instruct")
PAIR_FIELDS = ("pairs", "language", "categories")


def _fmt(x: float | None, digits: int = 4) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}g}"


def _ci(ci: list[float]) -> str:
    return f"[{_fmt(ci[0])}, {_fmt(ci[1])}]"


# Per method: the columns of a front row after the trial number, and how a trial fills them.
COLUMNS = {
    "heads": ("α", "heads", "effect (ΔS gain)", "KL", "ΔS"),
    "neurons": ("n", "factor", "score / rule", "effect (bias removed)", "KL", "first neurons"),
    "direction": ("weight", "layer", "width", "floor", "writers", "effect (marker rate removed)", "KL"),
}
SHOWN_NEURONS = 4


def _row(method: str, t: Trial) -> list[str]:
    p = t.params
    if method == "heads":
        heads = ", ".join(f"{la}.{h}" for la, h in t.heads or [])
        return [_fmt(p["alpha"], 3), heads, _fmt(t.effect), _fmt(t.kl, 3), _fmt(t.delta_s)]
    if method == "direction":
        # the floor as the trial lines and the report give it: a share of the peak weight
        floor = f"{p['floor_share']:.2f}×"
        kernel = [_fmt(p["weight"], 3), str(p["position"]), str(p["width"]), floor, p["modules"]]
        return [*kernel, _fmt(t.effect), _fmt(t.kl, 3)]
    first = ", ".join((t.neurons or [])[:SHOWN_NEURONS]) + (" …" if len(t.neurons or []) > SHOWN_NEURONS else "")
    return [str(p["n"]), _fmt(p["factor"], 3), f"{p['score']} / {p['rule']}", _fmt(t.effect), _fmt(t.kl, 3), first]


def print_tune(record: TuneRecord) -> None:
    """The front on the tune split (the chosen point marked) and the chosen point on the test split."""
    table = Table(title=f"Pareto front on the tune split ({len(record.trials)} trials): effect up, first-token KL down")
    for col in ("trial", *COLUMNS[record.method], "chosen"):
        table.add_column(col, no_wrap=True)
    for number in record.front:
        mark = f"✓ ({record.chosen.rule.replace('_', '-')})" if number == record.chosen.number else ""
        table.add_row(str(number), *_row(record.method, record.trial(number)), mark)
    print_table(table)
    c = record.confirmation
    what = {"heads": "test items", "neurons": "test pairs", "direction": "test prompts"}[record.method]
    change = {
        "heads": f"ΔS {_fmt(c.delta_s_base)} → {_fmt(c.delta_s)}",
        "neurons": f"pair bias {_fmt(c.bias_base)} → {_fmt(c.bias)} nats"
        + ("" if c.amplified is None else f", {100 * c.amplified:.0f}% of the pairs more biased"),
        "direction": f"marker rate {_fmt(c.rate_base)} → {_fmt(c.rate)}",
    }[record.method]
    out.print(
        f"Held-out confirmation ({c.items} {what}, {c.neutral} neutral prompts, never seen by the search): "
        f"effect {_fmt(c.effect)} {_ci(c.effect_ci95)}, KL {_fmt(c.kl, 3)} {_ci(c.kl_ci95)} (95% CIs); {change}"
    )
    if not c.effect_ci95[0] > 0:  # the number to expect: the search's own best is flattered by its choice
        note(
            f"the held-out effect's 95% CI {_ci(c.effect_ci95)} does not lie above 0: the chosen edit is not "
            f"shown to work on {what} the search never saw; give more prompts or a larger --test-share"
        )


@cli.command(name="tune")
@model_argument
@typed_options(TuneParams, into="params")
@typed_options(FindParams, into="prompts", only=PROMPT_FIELDS)
@typed_options(CaptureParams, into="capture", only=PAIR_FIELDS)
@click.option(
    "--findings",
    "findings_file",
    type=click.Path(path_type=Path),
    default=None,
    help="The method's findings file (default: the newest cached findings of MODEL).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Study folder: study.db (Optuna, SQLite) and tune.json; running again resumes it "
    "(default: a folder under the cache, by model and options).",
)
@click.option(
    "--bake",
    "bake_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Also bake the chosen point into this checkpoint folder (its surgery.json records the study).",
)
@click.option("--force", is_flag=True, help="With --bake: replace the folder if it exists.")
@click.option(
    "--verify/--no-verify",
    default=True,
    show_default=True,
    help="With --bake: check each edited weight map against the run-time edit before publishing.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the tune record as JSON (with --bake: the bake under 'baked')."
)
def tune_cmd(
    model: str,
    load: LoadSpec,
    params: TuneParams,
    prompts: FindParams,
    capture: CaptureParams,
    findings_file: Path | None,
    out_dir: Path | None,
    bake_dir: Path | None,
    force: bool,
    verify: bool,
    as_json: bool,
) -> None:
    """Search the parameters of MODEL's edit (heads: α and how many of the found heads; neurons: n,
    factor, score and selection rule; direction: the weight kernel and the residual writers) for the
    best effect at the least first-token KL, pick a point of the front and confirm it on held-out prompts."""
    with progress_bars() as progress:  # stderr, with --json too
        tuned = api.tune(
            model,
            findings=findings_file,
            out=out_dir,
            bake_out=bake_dir,
            bake=bake_settings(force, verify),
            load=load,
            params=params,
            prompts=prompts,
            capture=capture,
            progress=progress,
            report=note,
        )
    if as_json:
        baked = {"baked": tuned.baked.summary()} if tuned.baked is not None else {}
        print_json({**tuned.record.to_dict(), "file": str(tuned.path), **baked})
        return
    print_tune(tuned.record)
    out.print(f"Saved the tune record: {tuned.path}")
    if tuned.baked is not None:
        print_baked(tuned.baked)
