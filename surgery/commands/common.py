"""What every baking command shares: the MODEL / --out / --force options and the bake run."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable

import click

from ..bake import bake
from ..console import err, out, print_json, stage_progress
from ..edits import Recipe
from ..models import open_checkpoint
from ..verify import staged_check


def model_argument(f: Callable) -> Callable:
    """MODEL (local folder or Hub id) plus --revision and --trust-remote-code."""
    f = click.option("--trust-remote-code", is_flag=True,
                     help="Allow checkpoints whose config needs custom code (read that code first).")(f)
    f = click.option("--revision", default=None, help="Hub revision (branch, tag or commit) of MODEL.")(f)
    return click.argument("model")(f)


def bake_options(f: Callable) -> Callable:
    """--out, --force, --no-verify, --json."""
    f = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")(f)
    f = click.option("--verify/--no-verify", default=True, show_default=True,
                     help="Check the baked logits against the run-time edit before publishing.")(f)
    f = click.option("--force", is_flag=True, help="Replace --out if it exists.")(f)
    return click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path),
                        help="Output checkpoint folder (written atomically).")(f)


def run_bake(model: str, recipe: Recipe, out_dir: Path, *, revision: str | None = None,
             trust_remote_code: bool = False, force: bool = False, verify: bool = True,
             as_json: bool = False, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Open MODEL, bake ``recipe`` into ``out_dir`` and print a summary; returns the provenance."""
    ckpt, source = open_checkpoint(model, revision, trust_remote_code)
    recipe.validate(ckpt.config)
    if recipe.base_model is None:
        recipe = Recipe(recipe.edits, source.hub_id or str(source.path), recipe.version, recipe.notes)
    with stage_progress(not as_json) as progress:
        result = bake(ckpt, recipe, out_dir, source=source, force=force, progress=progress,
                      check=staged_check(ckpt, recipe) if verify else None, extra=extra,
                      report=lambda msg: err.print(f"[yellow]note:[/] {msg}"))
    prov = result.provenance
    if as_json:
        print_json({"out": str(out_dir), "edits": len(recipe.edits),
                    "tensors_edited": len(prov["edited_tensors"]),
                    "verification": prov.get("verification"), "notes": result.notes})
    else:
        ver = prov.get("verification")
        check = (f", max |Δlogit| vs run-time edit {ver['max_abs_logit_diff']:.2e}" if ver else "")
        out.print(f"[green]Baked[/] {len(recipe.edits)} edit(s) into {len(prov['edited_tensors'])} tensor(s)"
                  f"{check} → {out_dir}")
    return prov


def baking_command(f: Callable) -> Callable:
    """Decorate a command that ends in a bake with MODEL and the bake options."""
    return model_argument(bake_options(functools.wraps(f)(f)))
