"""Commands on checkpoints and recipes: inspect, apply, verify, undo."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from .. import api
from ..api.params import LoadSpec
from ..core.counted import counted
from .baking import bake_settings, print_baked, print_result
from .console import note, out, print_json, print_table, stage_progress
from .group import cli
from .options import load_options, model_argument, push_options, requantize_option


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"


@cli.command()
@model_argument(runs_model=False)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def inspect(model: str, load: LoadSpec, as_json: bool) -> None:
    """Show architecture, layers, heads, head_dim, MLP width, dtype, shards, size, and what an edit may
    touch in each kind of layer (or why the model is refused)."""
    info = api.inspect(model, load=load).to_dict()  # the table shows every fact --json prints
    if as_json:
        print_json(info)
        return
    table = Table(title=f"{model}", show_header=False)
    for key, value in info.items():
        if key == "layer_kinds":
            for kind in value:
                table.add_row("editable", kind["summary"])
        elif isinstance(value, dict):
            table.add_row(key, ", ".join(f"{k} {v}" for k, v in value.items()))
        else:
            table.add_row(
                key, _size(value) if key == "bytes" else ", ".join(value) if isinstance(value, list) else str(value)
            )
    print_table(table)


@cli.command()
@click.argument("recipe", type=click.Path(path_type=Path))
@click.option("--model", required=True, help="Checkpoint folder or Hub id the recipe is applied to.")
@load_options
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Output folder (a .gguf file when MODEL is a GGUF file).",
)
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@click.option(
    "--verify/--no-verify",
    default=True,
    show_default=True,
    help="Before publishing, run the source once in transformers (where its weights fit in memory; "
    "remembered per source) and check each edited weight map against the run-time edit.",
)
@click.option(
    "--allow-other-base",
    is_flag=True,
    help="Bake a recipe whose base_model names another model "
    "(refused otherwise: its α and n were chosen there); the output records both names.",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option(
    "--allow-zero",
    is_flag=True,
    help="Accept an alpha or factor that rounds a head's or neuron's "
    "weights to zero in the stored dtype (0 itself needs no flag).",
)
@requantize_option
@push_options
def apply(
    recipe: Path, model: str, load: LoadSpec, out_dir, force, verify, allow_other_base, as_json, allow_zero
) -> None:
    """Bake a recipe (YAML) into a copy of MODEL."""
    with stage_progress() as stages:  # stderr: shown with --json too, which owns stdout only
        baked = api.apply(
            recipe,
            model,
            out_dir,
            load=load,
            bake=bake_settings(force, verify, allow_zero=allow_zero, allow_other_base=allow_other_base),
            stages=stages,
            report=note,
        )
    if as_json:
        print_result(baked, as_json)
    else:
        print_baked(baked)


@cli.command(name="verify")
@click.argument("source")
@click.argument("baked", type=click.Path(path_type=Path))
@load_options(revision="Hub revision (branch, tag or commit) of SOURCE (BAKED is a local folder or file).")
@click.option("--structural-only", is_flag=True, help="Skip the logit comparison (no model is loaded).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def verify_cmd(source: str, baked: Path, load: LoadSpec, structural_only: bool, as_json: bool) -> None:
    """Check BAKED against SOURCE: files, bytes, hashes, and logits vs the run-time edit.

    Every sha256 in surgery.json is recomputed from the bytes (of BAKED and of SOURCE), also those
    the bake took rather than computed (a copied file's, a Hub-cache blob name). The logits come
    from one loaded model: the source with the run-time edit, then with the edited tensors swapped in.
    """
    with stage_progress() as stages:  # stderr, with --json too
        report = api.verify(source, baked, structural_only=structural_only, load=load, stages=stages)
    if as_json:
        print_json(report.to_dict())
    elif report.ok:
        diff = (
            f"; max |Δlogit| vs run-time edit {report.max_abs_logit_diff:.2e} "
            f"(tolerance {report.tolerance:.3g} = {report.tolerance_basis.describe()})"
            if report.max_abs_logit_diff is not None
            else ""
        )
        out.print(
            f"[green]OK[/]: {counted(report.files_checked, 'file')}, {counted(report.tensors_edited, 'edited tensor')} match "
            f"the source and the recipe{diff}"
        )
    else:
        for problem in report.problems:
            click.echo(f"FAIL: {problem}", err=True)
    if not report.ok:
        raise SystemExit(1)


@cli.command(name="undo")
@click.argument("baked", type=click.Path(path_type=Path))
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Output folder (a .gguf file when BAKED is a baked GGUF).",
)
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def undo_cmd(baked: Path, out_dir: Path, force: bool, as_json: bool) -> None:
    """Restore the exact source of a baked checkpoint (sha256-identical files)."""
    hashes = api.undo(baked, out_dir, force=force, report=note)
    if as_json:
        print_json({"out": str(out_dir), "files": hashes})
    else:
        out.print(f"[green]Restored[/] {counted(len(hashes), 'file')}, sha256-identical to the source → {out_dir}")
