"""Neuron commands: find-neurons (findings computed once) and prune-neurons (bake any n from them)."""

from __future__ import annotations

import math
from pathlib import Path

import click

from ..core.distributed import is_main
from ..core.edits import Recipe, parse_neurons
from ..core.errors import RecipeError
from ..find.neurons.find import describe
from ..find.neurons.params import CaptureParams, SelectParams
from ..find.neurons.select import selected_edits
from ..model.loading import LoadSpec
from .baking import bake_each, parse_values, sweep_label
from .console import note, out, print_json, progress_bars
from .group import cli
from .neuron_views import print_experts, print_summary, selection_extra
from .options import baking_command, model_argument, typed_options

RECOMPUTE = click.option("--recompute", is_flag=True, help="Ignore cached findings and capture again.")


def _findings(model: str, load: LoadSpec, capture: CaptureParams, recompute: bool, findings_file: Path | None,
              transfer: bool, any_categories: bool = False):
    """Findings from --findings, the cache, or a fresh capture.

    With ``any_categories`` (prune-neurons), --category only selects: findings over every category
    serve it, so a category-restricted capture runs only when it is already cached.
    """
    from ..find.neurons.find import NeuronFindings, cached_path, find_neurons
    from ..find.neurons.pairs import load_pairs
    from ..model.loading import open_checkpoint

    ckpt, _ = open_checkpoint(model, load)
    if findings_file is not None:
        if capture.pairs != "builtin" or capture.language or recompute:
            raise RecipeError("--findings already holds the scores; drop --pairs/--language/--recompute, "
                              "or drop --findings to compute new ones")
        found = NeuronFindings.read(findings_file, ckpt, transfer)
        if found.transfer_note:
            note(found.transfer_note)
        return found
    if transfer:
        raise RecipeError("--transfer applies to --findings from another checkpoint; give --findings FILE")
    pairs = load_pairs(capture.pairs, capture.language, capture.category_list)
    if any_categories and capture.categories and (recompute or not cached_path(ckpt, pairs, load).is_file()):
        pairs = load_pairs(capture.pairs, capture.language)
    with progress_bars() as progress:  # stderr, with --json too
        return find_neurons(ckpt, pairs, batch_size=capture.batch_size, strict=capture.strict, load=load,
                            recompute=recompute, progress=progress,
                            report=note)


@cli.command(name="find-neurons")
@model_argument
@typed_options(CaptureParams, into="capture")
@RECOMPUTE
@typed_options(SelectParams, into="choose")
@click.option("--n", "n", type=click.IntRange(min=1), default=40, show_default=True,
              help="How many top neurons to show (the findings keep every neuron's scores).")
@click.option("--out", "out_file", type=click.Path(path_type=Path), default=None,
              help="Also write the findings JSON here (they are always cached).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON (summary, not all scores).")
def find_neurons_cmd(model: str, load: LoadSpec, capture: CaptureParams, recompute: bool, choose: SelectParams,
                     n: int, out_file: Path | None, as_json: bool) -> None:
    """Score every MLP neuron on contrastive demographic pairs; cache the findings."""
    from ..find.neurons.find import describe, write_findings

    found = _findings(model, load, capture, recompute, None, False)
    if out_file is not None and is_main():  # under torchrun rank 0 alone writes
        write_findings(found.data, out_file)
    shown = describe(found.scores, found.select(n, choose, capture.category_list))
    data = found.data
    if as_json:
        print_json({"findings": str(found.path), "cached": found.from_cache, "out": str(out_file) if out_file else None,
                    "dataset": data.dataset.brief() if data.dataset else {},
                    "compute": data.compute.to_dict() if data.compute else None,
                    "summary": shown.to_dict(), **({"experts": data.experts.to_dict()} if data.experts else {})})
        return
    print_summary(shown, data.dataset)
    if data.experts:
        print_experts(data.experts)
    where = f"{found.path}" + (f" and {out_file}" if out_file else "")
    out.print(f"{'Cached' if found.from_cache else 'Saved'} findings: {where}")


@cli.command(name="prune-neurons")
@baking_command
@click.option("--neurons", default=None, help="Neurons as LAYER:INDEX pairs, e.g. 28:17,28:901 (or use --n).")
@click.option("--n", "n_spec", default=None,
              help="Prune the top N neurons from findings (computed once, cached); a list (20,40) bakes one "
                   "folder per value.")
@click.option("--findings", "findings_file", type=click.Path(path_type=Path), default=None,
              help="A neurons findings file (default: cached findings for MODEL, computed if missing).")
@click.option("--transfer", is_flag=True,
              help="Accept --findings from another checkpoint of the same architecture.")
@click.option("--factor", type=float, default=0.0, show_default=True,
              help="0 prunes (zeroes gate/up rows and the down column); other values scale the neuron "
                   "(0.5 damps, a negative value flips it, e.g. with --score signed).")
@click.option("--allow-zero", is_flag=True, help="Accept a --factor that rounds the neurons' down_proj weights "
              "to zero in the stored dtype (silences them without pruning; --factor 0 needs no flag).")
@typed_options(SelectParams, into="choose")
@typed_options(CaptureParams, into="capture")
@RECOMPUTE
def prune_neurons(model: str, load: LoadSpec, out_dir: Path, force: bool, verify: bool, as_json: bool,
                  neurons: str | None, n_spec: str | None, findings_file: Path | None, transfer: bool, factor: float,
                  allow_zero: bool, choose: SelectParams, capture: CaptureParams, recompute: bool) -> None:
    """Zero (or scale) MLP neurons — named, or the top N bias neurons — and write a new checkpoint."""
    if not math.isfinite(factor):
        raise RecipeError(f"--factor must be a finite number, got {factor}")
    if factor == 1.0:
        raise RecipeError("--factor 1 leaves every neuron unchanged; use 0 to prune or another value to scale")
    if (neurons is None) == (n_spec is None):
        raise RecipeError("give exactly one of --neurons LAYER:INDEX,… and --n N")
    bake_kw = dict(load=load, force=force, verify=verify, as_json=as_json, allow_zero=allow_zero)
    if neurons is not None:
        if findings_file or transfer:
            raise RecipeError("--neurons names the neurons itself; drop --findings/--transfer or use --n")
        bake_each(model, [(None, Recipe(tuple(parse_neurons(neurons, factor))), None)], out_dir, **bake_kw)
        return
    values = parse_values(n_spec, "--n")
    if any(v != int(v) or v < 1 for v in values):
        raise RecipeError(f"--n must be whole numbers ≥ 1, got {n_spec}")
    found = _findings(model, load, capture, recompute, findings_file, transfer, any_categories=True)
    items = []
    for n in (int(v) for v in values):
        chosen = found.select(n, choose, capture.category_list)
        shown = describe(found.scores, chosen)
        extra = selection_extra(found, shown, factor)
        if not as_json:
            print_summary(shown, found.data.dataset, title=f"n = {n}")
        recipe = Recipe(selected_edits(found.scores, chosen, factor))
        items.append((sweep_label("n", n), recipe, extra))
    bake_each(model, items, out_dir, **bake_kw)
