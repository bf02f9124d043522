"""Typed parameter objects are the command line: each option comes from one field, with its default,
bounds and help, and the command receives the object the user described."""

from __future__ import annotations

from dataclasses import dataclass

import click
import pytest
from click.testing import CliRunner

from surgery.cli.options import typed_options
from surgery.core.options import cli_fields, param
from surgery.evaluation.params import EvalParams
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


@pytest.mark.parametrize(
    "args, message",
    [
        (["--count", "0"], "x>=1"),
        (["--ratio", "1"], "x<1"),
        (["--way", "sideways"], "'sideways' is not one of"),
        (["--hidden", "3"], "No such option"),
    ],
)
def test_bounds_and_choices_come_from_the_field(args, message):
    command, _ = _command()
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 2 and message in result.output


def test_help_shows_each_default_once_by_the_name_the_user_types():
    command, _ = _command()
    text = CliRunner().invoke(command, ["--help"]).output
    assert "[default: auto]" in text and "[default: 3; x>=1]" in text and "--hidden" not in text


@pytest.mark.parametrize("cls", [LoadSpec, FindParams, CaptureParams, SelectParams, EvalParams])
def test_every_option_field_has_help_and_an_immutable_default(cls):
    fields = cli_fields(cls)
    assert fields and all(spec.help.endswith(".") for _, spec in fields)
    assert all(not isinstance(f.default, (list, dict, set)) for f, _ in fields)


def test_an_unknown_field_name_is_a_programming_error():
    with pytest.raises(KeyError, match="no option field"):
        cli_fields(Knobs, only=["count", "nope"])


# --- bounds: declared once on the field, checked on the command line and for Python callers ---------

PARAMETER_OBJECTS = [LoadSpec, FindParams, CaptureParams, SelectParams, EvalParams]
# Numeric options with no range, each with the reason and the check that still applies.
UNBOUNDED = {
    ("prune-neurons", "--factor"): "a scale: negative flips the neuron; NaN/inf refused, |factor| ≤ float32 max",
    ("ablate-direction", "--weight"): "a direction's weight: negative amplifies it; NaN/inf refused, weights the "
    "bake cannot store refused by the bake",
    ("ablate-direction", "--floor"): "the kernel's weight far from the peak: the same as --weight",
}


def _numeric_options():
    from surgery.cli.group import cli, register_all

    register_all()
    for name, command in sorted(cli.commands.items()):
        for p in command.params:
            if isinstance(p, click.Option) and isinstance(
                p.type, (click.types.IntParamType, click.types.FloatParamType)
            ):
                yield name, p


def test_every_numeric_option_of_every_command_is_bounded():
    seen, unbounded = set(), []
    for name, option in _numeric_options():
        key = (name, option.opts[0])
        seen.add(key)
        ranged = isinstance(option.type, (click.IntRange, click.FloatRange))
        if key not in UNBOUNDED and not (ranged and (option.type.min is not None or option.type.max is not None)):
            unbounded.append(f"{name} {option.opts[0]}")
    assert not unbounded, f"give these a range (param(..., minimum=…)) or list them in UNBOUNDED: {unbounded}"
    assert set(UNBOUNDED) <= seen, f"UNBOUNDED lists options that do not exist: {set(UNBOUNDED) - seen}"


def _outside(field, spec) -> list:
    """Values just outside the field's bounds, kind or choices."""
    if spec.is_flag:
        return ["yes"]
    if spec.choices is not None:
        return ["bogus"]
    kind = spec.kind or type(field.default).__name__
    bad = []
    if spec.minimum is not None:
        bad.append(spec.minimum - (1 if kind == "int" else 0.5))
    if spec.maximum is not None:
        bad.append(spec.maximum if spec.max_open else spec.maximum + 1)
    if kind == "float":
        bad += [float("nan"), float("inf")]
    if kind == "int":
        bad += [2.5, True]
    return bad


@pytest.mark.parametrize("cls", PARAMETER_OBJECTS, ids=lambda c: c.__name__)
def test_every_parameter_object_checks_its_own_bounds_and_choices(cls):
    from surgery.core.errors import OptionError

    cls()  # the defaults are inside every bound
    checked = 0
    for field, spec in cli_fields(cls):
        flag = spec.flag or "--" + field.name.replace("_", "-")
        for value in _outside(field, spec):
            given = (value,) if spec.multiple else value
            with pytest.raises(OptionError) as caught:
                cls(**{field.name: given})
            message = str(caught.value)
            assert flag in message and f"{cls.__name__}.{field.name}" in message and repr(value) in message, message
            checked += 1
    assert checked


@pytest.mark.parametrize(
    "args, needle",
    [
        (["eval", "MODEL", "--batch-size", "-3"], "-3 is not in the range x>=1"),  # was accepted: other numbers
        (["eval", "MODEL", "--batch-size", "0"], "0 is not in the range x>=1"),  # was an internal error
        (["eval", "MODEL", "--limit", "0"], "0 is not in the range x>=1"),
        (["find-heads", "MODEL", "--seed", "-1"], "-1 is not in the range x>=0"),  # numpy refuses negative seeds
        # click's FloatRange lets NaN through; the parameter object does not
        (
            ["find-neurons", "MODEL", "--bias-weight", "nan"],
            "--bias-weight (SelectParams.bias_weight) must be a finite",
        ),
        (["prune-neurons", "MODEL", "--n", "2", "--spare-active", "nan", "--out", "o"], "--spare-active (SelectParams"),
        (["find-neurons", "MODEL", "--layers", "2-x"], "--layers: '2-x' is not a layer"),  # before the capture
        (["find-neurons", "MODEL", "--layers", ""], "--layers is empty"),  # was every layer, without a word
    ],
)
def test_out_of_range_options_are_one_line_before_any_work(args, needle, capsys, tmp_path):
    from tests.support.cli import error_line, run_main

    line = error_line(run_main([str(tmp_path / "absent") if a == "MODEL" else a for a in args], capsys))
    assert needle in line, line


def test_python_callers_get_the_same_checks():
    from surgery.core.errors import OptionError, RecipeError
    from surgery.evaluation.suites import make_plan
    from surgery.find.heads.find import HeadFindings
    from surgery.find.heads.record import HeadsFindings

    with pytest.raises(OptionError, match=r"--batch-size \(EvalParams.batch_size\) must be ≥ 1, got -3"):
        make_plan(None, against=False, batch_size=-3)
    with pytest.raises(OptionError, match=r"--suite \(EvalParams.suites\) must be one of retention, kl"):
        make_plan(["nope"], against=False)
    found = HeadFindings(
        HeadsFindings.from_dict(
            {
                "format": "surgery-findings",
                "version": 1,
                "kind": "heads",
                "model": {"fingerprint": "f" * 64},
                "selected_heads": [[0, 1]],
                "discovery": {"heads": [{"layer": 0, "head": 1}]},
            }
        ),
        None,
        False,
    )
    assert found.select(1) == [(0, 1)]
    for top in (0, -1):  # 0 meant "the default", -1 cut the ranking from its end
        with pytest.raises(RecipeError, match=f"^top must be ≥ 1, got {top}$"):  # Python's spelling; the CLI's: --top
            found.select(top)
