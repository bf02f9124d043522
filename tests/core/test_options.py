"""Typed parameter objects are the command line: each option comes from one field, with its default,
bounds and help, and the command receives the object the user described."""

from __future__ import annotations

from dataclasses import dataclass

import click
import pytest
from click.testing import CliRunner

from surgery.cli.options import typed_options
from surgery.core.options import cli_fields, param
from surgery.find.heads.params import FindParams
from surgery.find.neurons.params import CaptureParams, SelectParams
from surgery.model.loading import LoadSpec


@dataclass(frozen=True)
class Knobs:
    count: int = param(3, "How many.", minimum=1)
    ratio: float = param(0.5, "How much.", minimum=0, maximum=1, max_open=True)
    mode: bool | None = param(None, "Which way.", flag="--way", choices={"auto": None, "up": True, "down": False})
    tags: tuple[str, ...] = param((), "Tags.", flag="--tag", multiple=True)
    loud: bool = param(False, "Shout.", is_flag=True)
    hidden: int = 7  # no option: not on the command line


def _command():
    seen = []

    @click.command()
    @typed_options(Knobs, into="knobs")
    @click.option("--other", default="x")
    def command(knobs: Knobs, other: str) -> None:
        seen.append((knobs, other))

    return command, seen


def test_the_command_receives_the_object_the_user_described():
    command, seen = _command()
    assert CliRunner().invoke(command, []).exit_code == 0
    assert seen[-1] == (Knobs(), "x")  # every default is the field's default
    args = ["--count", "5", "--ratio", "0.25", "--way", "down", "--tag", "a", "--tag", "b", "--loud", "--other", "y"]
    assert CliRunner().invoke(command, args).exit_code == 0
    assert seen[-1] == (Knobs(count=5, ratio=0.25, mode=False, tags=("a", "b"), loud=True), "y")


@pytest.mark.parametrize("args, message", [
    (["--count", "0"], "x>=1"), (["--ratio", "1"], "x<1"), (["--way", "sideways"], "'sideways' is not one of"),
    (["--hidden", "3"], "No such option"),
])
def test_bounds_and_choices_come_from_the_field(args, message):
    command, _ = _command()
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 2 and message in result.output


def test_help_shows_each_default_once_by_the_name_the_user_types():
    command, _ = _command()
    text = CliRunner().invoke(command, ["--help"]).output
    assert "[default: auto]" in text and "[default: 3; x>=1]" in text and "--hidden" not in text


@pytest.mark.parametrize("cls", [LoadSpec, FindParams, CaptureParams, SelectParams])
def test_every_option_field_has_help_and_an_immutable_default(cls):
    fields = cli_fields(cls)
    assert fields and all(spec.help.endswith(".") for _, spec in fields)
    assert all(not isinstance(f.default, (list, dict, set)) for f, _ in fields)


def test_an_unknown_field_name_is_a_programming_error():
    with pytest.raises(KeyError, match="no option field"):
        cli_fields(Knobs, only=["count", "nope"])
