"""import-gguf: a GGUF file becomes a safetensors checkpoint that every other command can use."""

from __future__ import annotations

from pathlib import Path

import click

from .. import api
from ..api.params import GGUF_DTYPES
from .console import note, out, print_json, stage_progress
from .group import cli


@cli.command(name="import-gguf")
@click.argument("gguf_file", type=click.Path(path_type=Path))
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Output checkpoint folder (written atomically).",
)
@click.option(
    "--dtype",
    type=click.Choice(GGUF_DTYPES),
    default="float32",
    show_default=True,
    help="Storage dtype of the dequantized weights.",
)
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def import_gguf_cmd(gguf_file: Path, out_dir: Path, dtype: str, force: bool, as_json: bool) -> None:
    """Dequantize GGUF_FILE into a safetensors checkpoint (config, weights, tokenizer) at --out."""
    with stage_progress() as progress:  # stderr, with --json too
        result = api.import_gguf(gguf_file, out_dir, dtype=dtype, force=force, report=note, stages=progress)
    m = result.manifest
    if as_json:
        print_json({"out": str(out_dir), **m, "notes": result.notes})
        return
    size = sum((out_dir / n).stat().st_size for n in m["files"]) / 2**20
    out.print(
        f"[green]Imported[/] {m['gguf']['file']} ({m['gguf']['architecture']}, "
        f"{m['gguf']['file_type'] or 'no declared file type'}) as {m['model_type']} in {dtype}, "
        f"{size:.0f} MB → {out_dir}"
    )
