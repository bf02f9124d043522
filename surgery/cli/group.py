"""The ``surgery`` click group; the command modules add their commands to it."""

from __future__ import annotations

import click

from .. import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="surgery")
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
def cli(debug: bool) -> None:
    """Find the attention heads and MLP neurons behind a behaviour; bake edits into checkpoints."""
