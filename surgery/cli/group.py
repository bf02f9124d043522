"""The ``surgery`` click group; the command modules add their commands to it.

A command's module is imported when that command is asked for, so ``surgery find-neurons`` loads
the neuron commands and not the GGUF import, the shipping or the direction commands.
"""

from __future__ import annotations

import importlib

import click

from .. import __version__
from .misplaced import Command

# command → the module of surgery.cli that defines it (tests/cli/test_group.py checks the table)
COMMANDS = {
    "inspect": "core",
    "apply": "core",
    "verify": "core",
    "undo": "core",
    "find-direction": "directions",
    "ablate-direction": "directions",
    "import-gguf": "gguf",
    "score-binding": "heads",
    "find-heads": "heads",
    "amplify-heads": "heads",
    "find-neurons": "neurons",
    "prune-neurons": "neurons",
    "tune": "tune",
    "export-lora": "ship",
    "push": "ship",
    "card": "ship",
    "eval": "ship",
    "report": "ship",
}


def register_all() -> None:
    """Import every command module (the full list, for help pages and the documentation's checks)."""
    for module in dict.fromkeys(COMMANDS.values()):
        importlib.import_module(f"{__package__}.{module}")


class Commands(click.Group):
    """A group whose commands are imported on first use (see :data:`COMMANDS`); each says where a
    required option's value given positionally goes (surgery.cli.misplaced)."""

    command_class = Command

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(f"{__package__}.{COMMANDS[cmd_name]}")
        return super().get_command(ctx, cmd_name)


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="surgery")
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
def cli(debug: bool) -> None:
    """Find the attention heads and MLP neurons behind a behaviour; bake edits into checkpoints."""
