"""Click options generated from typed parameter objects (see surgery.core.options).

``@typed_options(FindParams, into="params")`` adds one option per option field of FindParams, with
the field's default, bounds and help, and calls the command with ``params=FindParams(...)`` instead
of one keyword per option.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, Sequence

import click

from ..core.options import CliOption, cli_fields


def _click_type(field: dataclasses.Field, spec: CliOption) -> Any:
    if spec.choices is not None:
        return click.Choice(list(spec.choices))
    kind = spec.kind or type(field.default).__name__
    bounded = spec.minimum is not None or spec.maximum is not None
    if kind == "int":
        return click.IntRange(spec.minimum, spec.maximum, max_open=spec.max_open) if bounded else int
    if kind == "float":
        return click.FloatRange(spec.minimum, spec.maximum, max_open=spec.max_open) if bounded else float
    return str


def _shown_default(field: dataclasses.Field, spec: CliOption) -> Any:
    """The default as the user types it (the choice's name when choices map to values)."""
    if isinstance(spec.choices, Mapping):
        return next(name for name, value in spec.choices.items() if value == field.default)
    return field.default


def _option(field: dataclasses.Field, spec: CliOption) -> Callable:
    flag = spec.flag or "--" + field.name.replace("_", "-")
    if spec.is_flag:
        return click.option(flag, field.name, is_flag=True, default=bool(field.default), help=spec.help)
    shown = _shown_default(field, spec)
    return click.option(flag, field.name, type=_click_type(field, spec), default=shown, multiple=spec.multiple,
                        show_default=shown not in (None, ()), metavar=spec.metavar, help=spec.help)


def _value(spec: CliOption, raw: Any) -> Any:
    if isinstance(spec.choices, Mapping):
        return spec.choices[raw]
    return tuple(raw) if spec.multiple else raw


def typed_options(cls: type, *, into: str, only: Sequence[str] | None = None,
                  skip: Sequence[str] = ()) -> Callable[[Callable], Callable]:
    """Add the options of ``cls``'s fields (``only`` / ``skip`` choose); the command gets ``into=cls(…)``."""
    specs = cli_fields(cls, only, skip)

    def decorate(f: Callable) -> Callable:
        @functools.wraps(f)
        def command(*args: Any, **kwargs: Any) -> Any:
            values = {field.name: _value(spec, kwargs.pop(field.name)) for field, spec in specs}
            return f(*args, **{into: cls(**values)}, **kwargs)

        for field, spec in reversed(specs):
            command = _option(field, spec)(command)
        return command

    return decorate
