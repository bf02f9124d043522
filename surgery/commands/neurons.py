"""Neuron commands: prune-neurons."""

from __future__ import annotations

import math

import click

from ..cli import cli
from ..edits import Recipe, parse_neurons
from ..errors import RecipeError
from .common import baking_command, run_bake


@cli.command(name="prune-neurons")
@baking_command
@click.option("--neurons", required=True, help="Neurons as LAYER:INDEX pairs, e.g. 28:17,28:901.")
@click.option("--factor", type=float, default=0.0, show_default=True,
              help="0 prunes (zeroes gate/up rows and the down column); other values scale the neuron.")
def prune_neurons(model, revision, trust_remote_code, out_dir, force, verify, as_json, neurons, factor):
    """Zero (or scale) chosen MLP neurons and write a new checkpoint."""
    if not math.isfinite(factor):
        raise RecipeError(f"--factor must be a finite number, got {factor}")
    recipe = Recipe(tuple(parse_neurons(neurons, factor)))
    run_bake(model, recipe, out_dir, revision=revision, trust_remote_code=trust_remote_code,
             force=force, verify=verify, as_json=as_json)
