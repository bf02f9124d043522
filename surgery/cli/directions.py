"""Direction commands: find-direction (per-layer directions, cached) and ablate-direction (bake them out)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table

from .. import api
from ..api.params import DirectionParams, KernelParams, LoadSpec
from ..core.counted import counted
from .baking import bake_settings, each_line, print_result
from .console import both_progress, note, out, print_json, print_table, progress_bars
from .group import cli
from .options import RECOMPUTE, baking_command, model_argument, typed_options

if TYPE_CHECKING:
    from ..api.records import DirectionsFindings


def print_layers(data: DirectionsFindings) -> None:
    """One row per layer: the direction's norm, how well it separates the two sets."""
    sides = (data.dataset.a, data.dataset.b) if data.dataset else (None, None)
    counts = ", ".join(
        f"--{name}: {side.prompts} prompt{'' if side.prompts == 1 else 's'}" for side, name in zip(sides, "ab") if side
    )
    table = Table(
        title="Directions: mean(a) − mean(b) at the last prompt token after each layer",
        # The accuracy is of the prompts the direction was computed from: with a few, 100 % says little.
        caption=f"{counts}; separation and accuracy are measured on these same prompts" if counts else None,
    )
    for col in ("layer", "‖direction‖", "‖mean a‖", "‖mean b‖", "separation (d)", "accuracy", "cos to best"):
        table.add_column(col, justify="right")
    best = data.best_layer
    for row in data.layers:
        mark = " ◀" if row.layer == best else ""
        table.add_row(
            f"{row.layer}{mark}",
            f"{row.norm:.3g}",
            f"{row.norm_a:.3g}",
            f"{row.norm_b:.3g}",
            f"{row.separation:.2f}",
            f"{100 * row.accuracy:.0f} %",
            f"{data.cosine[best][row.layer]:.2f}",
        )
    print_table(table)


@cli.command(name="find-direction")
@model_argument
@typed_options(DirectionParams, into="params")
@RECOMPUTE
@click.option(
    "--out",
    "out_file",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write the findings JSON here (and its vectors next to it, as .safetensors).",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def find_direction_cmd(
    model: str, load: LoadSpec, params: DirectionParams, recompute: bool, out_file: Path | None, as_json: bool
) -> None:
    """Per-layer directions between two prompt sets (--a shows the behaviour, --b does not); cache them."""
    with progress_bars() as progress:
        found = api.find_direction(
            model, recompute=recompute, out=out_file, load=load, params=params, progress=progress, report=note
        )
    data = found.data
    if as_json:
        print_json(
            {
                "findings": str(found.path),
                "vectors": str(found.vectors),
                "cached": found.from_cache,
                "out": str(out_file) if out_file else None,
                "dataset": data.dataset.to_dict() if data.dataset else None,
                "best_layer": data.best_layer,
                "layers": [row.to_dict() for row in data.layers],
            }
        )
        return
    print_layers(data)
    where = f"{found.path}" + (f" and {out_file}" if out_file else "")
    best = data.best_words()  # one prompt a side: every layer ties, and "layer 0" would be no finding
    out.print(f"{best[0].upper()}{best[1:]}. {'Cached' if found.from_cache else 'Saved'} findings: {where}")


@cli.command(name="ablate-direction")
@baking_command
@click.option(
    "--direction",
    "direction_file",
    required=True,
    type=click.Path(path_type=Path),
    help="A findings file of surgery find-direction.",
)
@click.option("--transfer", is_flag=True, help="Accept --direction from another checkpoint of the same architecture.")
@typed_options(KernelParams, into="kernel")
def ablate_direction_cmd(
    model: str,
    load: LoadSpec,
    out_dir: Path,
    force: bool,
    verify: bool,
    as_json: bool,
    direction_file: Path,
    transfer: bool,
    kernel: KernelParams,
) -> None:
    """Bake a direction out of the residual writers: W ← W − w·r(rᵀW), per-layer weights (--add: b ← b + w·r)."""

    def show(plans: list[api.Planned]) -> None:
        if not as_json:
            weights = plans[0].extra["direction_kernel"]["weights"]
            shown = ", ".join(f"{layer}: {w:g}" for layer, w in weights.items())
            out.print(f"Layer weights: {shown} ({counted(len(plans[0].recipe.edits), 'edit')})")

    with both_progress() as (_, stages):
        result = api.ablate_direction(
            model,
            out_dir,
            direction=direction_file,
            transfer=transfer,
            bake=bake_settings(force, verify),
            load=load,
            kernel=kernel,
            callbacks=api.Callbacks(stages=stages, report=note, on_plans=show, on_each=each_line(as_json)),
        )
    print_result(result, as_json)
