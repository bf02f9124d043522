"""Commands on checkpoints and recipes: inspect, apply, verify, undo."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from ..bake.undo import undo as undo_bake
from ..bake.verify import verify as verify_bake
from ..core.architectures import architecture
from ..core.edits import Recipe
from ..model.loading import LoadSpec, open_checkpoint
from .baking import run_bake
from .console import note, out, print_json, stage_progress
from .group import cli
from .options import load_options, model_argument, push_options


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
    """Show architecture, layers, heads, head_dim, MLP width, dtype, shards and size."""
    ckpt, source = open_checkpoint(model, load)
    arch = architecture(ckpt.config)
    g = arch.geometry
    dtypes = sorted({t.dtype for t in ckpt.tensors.values()})
    info = {
        "path": str(source.path), "model_type": arch.model_type, "layers": g.num_layers,
        "heads": g.num_heads, "kv_heads": g.num_kv_heads, "head_dim": g.head_dim,
        "hidden_size": g.hidden_size, "mlp_width": g.intermediate_size, "dtypes": dtypes,
        "shards": len(ckpt.weight_files), "tensors": len(ckpt.tensors), "bytes": ckpt.total_bytes(),
        "layer_prefix": arch.layer_prefix(ckpt.tensors).format(layer="N"),
    }
    if g.sparse_layers:  # mixture of experts: neurons are named L:eE:N (routed), L:s:N (shared)
        info.update(experts=g.num_experts, expert_width=g.expert_size,
                    expert_layers=f"{len(g.sparse_layers)} of {g.num_layers}",
                    expert_layout="fused 3-D" if arch.fused_experts(ckpt.tensors) else "one tensor per expert")
        if g.shared_size:
            info["shared_expert_width"] = g.shared_size
    if as_json:
        print_json(info)
        return
    table = Table(title=f"{model}", show_header=False)
    for key, value in info.items():
        table.add_row(key, _size(value) if key == "bytes" else ", ".join(value) if isinstance(value, list) else str(value))
    out.print(table)


@cli.command()
@click.argument("recipe", type=click.Path(path_type=Path))
@click.option("--model", required=True, help="Checkpoint folder or Hub id the recipe is applied to.")
@load_options
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Output folder.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Check each edited weight map against the run-time edit before publishing.")
@click.option("--allow-other-base", is_flag=True, help="Bake a recipe whose base_model names another model "
              "(refused otherwise: its α and n were chosen there); the output records both names.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--allow-zero", is_flag=True, help="Accept an alpha or factor that rounds a head's or neuron's "
              "weights to zero in the stored dtype (0 itself needs no flag).")
@push_options
def apply(recipe: Path, model: str, load: LoadSpec, out_dir, force, verify, allow_other_base, as_json,
          allow_zero) -> None:
    """Bake a recipe (YAML) into a copy of MODEL."""
    run_bake(model, Recipe.load(recipe), out_dir, load=load, force=force, verify=verify, as_json=as_json,
             allow_other_base=allow_other_base, allow_zero=allow_zero)


@cli.command(name="verify")
@click.argument("source")
@click.argument("baked", type=click.Path(path_type=Path))
@load_options
@click.option("--structural-only", is_flag=True, help="Skip the logit comparison (no model is loaded).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def verify_cmd(source: str, baked: Path, load: LoadSpec, structural_only: bool, as_json: bool) -> None:
    """Check BAKED against SOURCE: files, bytes, hashes, and logits vs the run-time edit.

    Every sha256 in surgery.json is recomputed from the bytes (of BAKED and of SOURCE), also those
    the bake took rather than computed (a copied file's, a Hub-cache blob name). The logits come
    from one loaded model: the source with the run-time edit, then with the edited tensors swapped in.
    """
    ckpt, _ = open_checkpoint(source, load)
    with stage_progress() as progress:  # stderr, with --json too
        report = verify_bake(ckpt, baked, run_model=not structural_only, load=load, progress=progress)
    if as_json:
        print_json(report.to_dict())
    elif report.ok:
        diff = ("" if report.max_abs_logit_diff is None else
                f"; max |Δlogit| vs run-time edit {report.max_abs_logit_diff:.2e} (tolerance {report.tolerance:g})")
        out.print(f"[green]OK[/]: {report.files_checked} files, {report.tensors_edited} edited tensors match "
                  f"the source and the recipe{diff}")
    else:
        for problem in report.problems:
            click.echo(f"FAIL: {problem}", err=True)
    if not report.ok:
        raise SystemExit(1)


@cli.command(name="undo")
@click.argument("baked", type=click.Path(path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Output folder.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def undo_cmd(baked: Path, out_dir: Path, force: bool, as_json: bool) -> None:
    """Restore the exact source of a baked checkpoint (sha256-identical files)."""
    hashes = undo_bake(baked, out_dir, force, report=note)
    if as_json:
        print_json({"out": str(out_dir), "files": hashes})
    else:
        out.print(f"[green]Restored[/] {len(hashes)} files, sha256-identical to the source → {out_dir}")


