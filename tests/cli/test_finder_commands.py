"""The finder registry names the commands of each family: they exist, and each bake command's
--findings help is the family's."""

from __future__ import annotations

import click

from surgery.cli.group import COMMANDS, cli
from surgery.find.finders import finders


def test_every_finder_names_commands_that_exist_with_its_findings_options():
    for family in finders():
        assert {family.find_command, family.bake_command} <= set(COMMANDS), family.name
        command = cli.get_command(click.Context(cli), family.bake_command)
        options = {name for p in command.params for name in p.opts}
        if family.name == "directions":  # ablate-direction reads its findings as --direction
            assert {"--direction", "--transfer"} <= options
            continue
        assert {"--findings", "--transfer", "--recompute"} <= options, family.name
        help_text = next(p.help for p in command.params if "--findings" in p.opts)
        assert help_text.startswith(f"A {family.name} findings file") and family.find_command in help_text
