"""A required option's value given as an argument (``surgery apply R.yaml MODEL``) is named, with the
line to write, for every command that has a required option: not "Missing option '--model'"."""

from __future__ import annotations

import click
import pytest

from surgery.cli.group import cli, register_all
from tests.support.cli import error_line, run_here


def _commands_with_a_required_option() -> list[tuple[str, list[str], click.Option]]:
    """(command, its arguments filled in, its first required option) where an extra argument is
    left over (no argument takes any number of values)."""
    register_all()
    found = []
    for name, command in sorted(cli.commands.items()):
        arguments = [p for p in command.params if isinstance(p, click.Argument)]
        required = [p for p in command.params if isinstance(p, click.Option) and p.required]
        if required and all(a.nargs == 1 for a in arguments):
            found.append((name, [a.name.upper() for a in arguments], required[0]))
    return found


def test_apply_and_export_lora_are_among_the_commands_checked():
    checked = {(name, option.opts[0]) for name, _, option in _commands_with_a_required_option()}
    assert {("apply", "--model"), ("export-lora", "--recipe")} <= checked


@pytest.mark.parametrize(
    ("name", "arguments", "option"),
    _commands_with_a_required_option(),
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_required_option_given_as_an_argument_is_named(name, arguments, option):
    others = [
        word
        for p in cli.commands[name].params
        if isinstance(p, click.Option) and p.required and p is not option
        for word in (p.opts[0], "x")
    ]
    line = error_line(run_here([name, *arguments, "VALUE", *others]))
    assert "Missing option" not in line
    fixed = " ".join([name, *arguments, option.opts[0], "VALUE", *others])
    assert line == f"Error: VALUE goes after {option.opts[0]}: surgery {fixed} (see --help)"


def test_the_line_to_write_keeps_the_order_and_names_what_is_still_missing():
    line = error_line(run_here(["apply", "R.yaml", "my model"]))
    assert (
        line == "Error: 'my model' goes after --model: surgery apply R.yaml --model 'my model' --out OUT (see --help)"
    )
    line = error_line(run_here(["apply", "R.yaml", "M", "O"]))
    assert line == "Error: M and O go after --model and --out: surgery apply R.yaml --model M --out O (see --help)"
    line = error_line(run_here(["export-lora", "M", "--out", "o", "R.yaml"]))
    assert line == "Error: R.yaml goes after --recipe: surgery export-lora M --out o --recipe R.yaml (see --help)"


def test_more_arguments_than_missing_options_is_not_guessed():
    line = error_line(run_here(["apply", "R.yaml", "M", "O", "extra"]))
    assert line == "Error: Missing option '--model'. (see --help)"
