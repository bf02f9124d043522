"""Typed parameters that the command line offers as options: one dataclass field, one option.

A parameter object (``LoadSpec``, ``FindParams``, ``CaptureParams``, ``SelectParams``) declares each
field with :func:`param`: its default, its help text and how it is spelled and bounded on the
command line. The CLI builds its click options from these fields (``surgery.cli.options``)
and hands the command one typed object, so a default lives in one place and an option cannot be
dropped between the command line and the code that uses it. Each object checks its own fields
against the same bounds and choices (:func:`check_options` in ``__post_init__``), so a Python
caller gets the command line's checks. No click here: the library stays free of the command line.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

from .counted import in_number
from .errors import OptionError


@dataclass(frozen=True)
class CliOption:
    """How one field appears on the command line."""

    help: str
    flag: str | None = None  # default: --field-name
    kind: str | None = None  # "int", "float" or "str" when the default does not say (None)
    choices: Sequence[str] | Mapping[str, Any] | None = None  # a mapping turns each choice into a value
    minimum: float | None = None
    maximum: float | None = None
    max_open: bool = False  # the maximum itself is not allowed
    is_flag: bool = False
    multiple: bool = False  # repeatable; the value is a tuple
    metavar: str | None = None


def param(default: Any, help: str, **cli: Any) -> Any:
    """A dataclass field with ``default`` that the command line shows as an option (see CliOption)."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("give an immutable default (a tuple)")
    return dataclasses.field(default=default, metadata={"cli": CliOption(help=help, **cli)})


def cli_fields(
    cls: type, only: Sequence[str] | None = None, skip: Sequence[str] = ()
) -> list[tuple[dataclasses.Field, CliOption]]:
    """The fields of ``cls`` that are options, in declaration order (``only`` picks and orders them)."""
    fields = {f.name: f for f in dataclasses.fields(cls) if "cli" in f.metadata}
    unknown = set(only or ()) - set(fields) | set(skip) - set(fields)
    if unknown:
        raise KeyError(f"{cls.__name__} has no option {in_number(len(unknown), 'field')} {sorted(unknown)}")
    names = [n for n in (only or fields) if n not in set(skip)]
    return [(fields[n], fields[n].metadata["cli"]) for n in names]


def check_options(obj: Any) -> None:
    """Refuse a field of ``obj`` (a parameter object) outside its option's bounds, kind or choices.

    Called by each parameter object's ``__post_init__``: click checks the command line too, but
    it lets NaN through a float range, and a Python caller has no click at all. A field whose
    default is None may be None (not given).
    """
    for field, spec in cli_fields(type(obj)):
        value = getattr(obj, field.name)
        if value is None and field.default is None:
            continue
        name = f"{spec.flag or '--' + field.name.replace('_', '-')} ({type(obj).__name__}.{field.name})"
        if spec.multiple and not isinstance(value, (tuple, list)):
            raise OptionError(f"{name} must be a tuple of values, got {value!r}")
        for item in value if spec.multiple else (value,):
            _check_value(name, field, spec, item)


def _check_value(name: str, field: dataclasses.Field, spec: CliOption, value: Any) -> None:
    if spec.is_flag:
        if not isinstance(value, bool):
            raise OptionError(f"{name} is a switch: give True or False, got {value!r}")
        return
    if spec.choices is not None:
        allowed = spec.choices.values() if isinstance(spec.choices, Mapping) else spec.choices
        if value not in list(allowed):
            shown = (
                ", ".join(f"{k} ({v!r})" for k, v in spec.choices.items())
                if isinstance(spec.choices, Mapping)
                else ", ".join(map(str, spec.choices))
            )
            raise OptionError(f"{name} must be one of {shown}, got {value!r}")
        return
    kind = spec.kind or type(field.default).__name__
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, Integral)):
        raise OptionError(f"{name} must be a whole number, got {value!r}")
    if kind == "float" and (isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value)):
        raise OptionError(f"{name} must be a finite number, got {value!r}")
    if kind in ("int", "float") and not _within(value, spec):
        raise OptionError(f"{name} must be {_bounds_text(spec)}, got {value!r}")


def _within(value: float, spec: CliOption) -> bool:
    if spec.minimum is not None and value < spec.minimum:
        return False
    if spec.maximum is not None and (value >= spec.maximum if spec.max_open else value > spec.maximum):
        return False
    return True


def _bounds_text(spec: CliOption) -> str:
    """``≥ 1``, ``≤ 10``, ``in [0, 1)``: the range of a bounded option, as its errors say it."""
    low, high = spec.minimum, spec.maximum
    if low is not None and high is not None:
        return f"in [{low:g}, {high:g}{')' if spec.max_open else ']'}"
    if low is not None:
        return f"≥ {low:g}"
    return f"< {high:g}" if spec.max_open else f"≤ {high:g}"
