"""Head commands: amplify-heads."""

from __future__ import annotations

import math

import click

from ..cli import cli
from ..edits import Recipe, parse_heads
from ..errors import RecipeError
from .common import baking_command, run_bake


def check_alpha(alpha: float, allow_zero: bool) -> None:
    if not math.isfinite(alpha):
        raise RecipeError(f"--alpha must be a finite number, got {alpha}")
    if alpha == 0 and not allow_zero:
        raise RecipeError("--alpha 0 does not amplify: it silences the heads entirely (ablation); "
                          "pass --allow-zero if that is what you want")


@cli.command(name="amplify-heads")
@baking_command
@click.option("--heads", required=True, help="Heads as LAYER.HEAD pairs, e.g. 7.7,8.17 (0-based).")
@click.option("--alpha", type=float, required=True, help="Scale of each head's output (2.5 amplifies).")
@click.option("--allow-zero", is_flag=True, help="Accept --alpha 0 (removes the heads).")
def amplify_heads(model, revision, trust_remote_code, out_dir, force, verify, as_json, heads, alpha, allow_zero):
    """Scale the o_proj input columns of chosen heads by ALPHA and write a new checkpoint."""
    check_alpha(alpha, allow_zero)
    recipe = Recipe(tuple(parse_heads(heads, alpha)))
    run_bake(model, recipe, out_dir, revision=revision, trust_remote_code=trust_remote_code,
             force=force, verify=verify, as_json=as_json)
