"""Neuron commands: find-neurons (findings computed once) and prune-neurons (bake any n from them)."""

from __future__ import annotations

from pathlib import Path

import click

from .. import api
from ..api.params import CaptureParams, LoadSpec, SelectParams
from ..api.records import NeuronsDataset, NeuronSelection
from .baking import bake_settings, each_line, parse_values, print_result
from .console import both_progress, note, out, print_json, progress_bars
from .group import cli
from .neuron_views import print_experts, print_summary
from .options import RECOMPUTE, baking_command, findings_options, given, model_argument, typed_options


@cli.command(name="find-neurons")
@model_argument
@typed_options(CaptureParams, into="capture")
@RECOMPUTE
@typed_options(SelectParams, into="choose")
@click.option(
    "--n",
    "n",
    type=click.IntRange(min=1),
    default=40,
    show_default=True,
    help="How many top neurons to show (the findings keep every neuron's scores).",
)
@click.option(
    "--out",
    "out_file",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write the findings JSON here (they are always cached).",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON (summary, not all scores).")
def find_neurons_cmd(
    model: str,
    load: LoadSpec,
    capture: CaptureParams,
    recompute: bool,
    choose: SelectParams,
    n: int,
    out_file: Path | None,
    as_json: bool,
) -> None:
    """Score every MLP neuron on contrastive demographic pairs; cache the findings."""
    with progress_bars() as progress:  # stderr, with --json too
        found = api.find_neurons(
            model, recompute=recompute, out=out_file, load=load, capture=capture, progress=progress, report=note
        )
    shown = api.neuron_summary(found, n, choose, capture.category_list)
    data = found.data
    if as_json:
        print_json(
            {
                "findings": str(found.path),
                "cached": found.from_cache,
                "out": str(out_file) if out_file else None,
                "dataset": data.dataset.brief() if data.dataset else {},
                "compute": data.compute.to_dict() if data.compute else None,
                "summary": shown.to_dict(),
                **({"experts": data.experts.to_dict()} if data.experts else {}),
            }
        )
        return
    print_summary(shown, data.dataset)
    if data.experts:
        print_experts(data.experts)
    where = f"{found.path}" + (f" and {out_file}" if out_file else "")
    out.print(f"{'Cached' if found.from_cache else 'Saved'} findings: {where}")


@cli.command(name="prune-neurons")
@baking_command
@click.option("--neurons", default=None, help="Neurons as LAYER:INDEX pairs, e.g. 28:17,28:901 (or use --n).")
@click.option(
    "--n",
    "n_spec",
    default=None,
    help="Prune the top N neurons from findings (computed once, cached); a list (20,40) bakes one folder per value.",
)
@findings_options("neurons")
@click.option(
    "--factor",
    type=float,
    default=0.0,
    show_default=True,
    help="0 prunes (zeroes gate/up rows and the down column); other values scale the neuron "
    "(0.5 damps, a negative value flips it, e.g. with --score signed).",
)
@click.option(
    "--allow-zero",
    is_flag=True,
    help="Accept a --factor that rounds the neurons' down_proj weights "
    "to zero in the stored dtype (silences them without pruning; --factor 0 needs no flag).",
)
@typed_options(SelectParams, into="choose")
@typed_options(CaptureParams, into="capture", optional=True)
def prune_neurons(
    model: str,
    load: LoadSpec,
    out_dir: Path,
    force: bool,
    verify: bool,
    as_json: bool,
    neurons: str | None,
    n_spec: str | None,
    source: api.FindingsSource,
    factor: float,
    allow_zero: bool,
    choose: SelectParams,
    capture: CaptureParams | None,
) -> None:
    """Zero (or scale) MLP neurons — named, or the top N bias neurons — and write a new checkpoint."""

    def show(plans: list[api.Planned]) -> None:  # what each value of n bakes, before it is baked
        for plan in plans if not as_json else ():
            if not plan.extra:
                continue  # neurons named on the command line: no selection to show
            selection = NeuronSelection.from_dict(plan.extra["neuron_selection"])
            dataset = NeuronsDataset.from_dict(plan.extra["neuron_findings"]["dataset"])
            print_summary(selection, dataset, title=f"n = {selection.n}")

    if source.findings is not None and given("pairs"):  # --pairs builtin is the default: only the CLI can tell
        from ..api.neurons import findings_hold_the_scores

        raise findings_hold_the_scores()
    ns = None if n_spec is None else [v if v != int(v) else int(v) for v in parse_values(n_spec, "n", "20,40")]
    with both_progress() as (progress, stages):  # stderr, with --json too
        result = api.prune_neurons(
            model,
            out_dir,
            n=ns,
            neurons=neurons,
            factor=factor,
            source=source,
            bake=bake_settings(force, verify, allow_zero=allow_zero),
            load=load,
            capture=capture,
            select=choose,
            callbacks=api.Callbacks(
                progress=progress, stages=stages, report=note, on_plans=show, on_each=each_line(as_json)
            ),
        )
    print_result(result, as_json)
