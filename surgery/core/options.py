"""Typed parameters that the command line offers as options: one dataclass field, one option.

A parameter object (``LoadSpec``, ``FindParams``, ``CaptureParams``, ``SelectParams``) declares each
field with :func:`param`: its default, its help text and how it is spelled and bounded on the
command line. The CLI builds its click options from these fields (``surgery.cli.options``)
and hands the command one typed object, so a default lives in one place and an option cannot be
dropped between the command line and the code that uses it. No click here: the library stays
free of the command line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


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


def cli_fields(cls: type, only: Sequence[str] | None = None,
               skip: Sequence[str] = ()) -> list[tuple[dataclasses.Field, CliOption]]:
    """The fields of ``cls`` that are options, in declaration order (``only`` picks and orders them)."""
    fields = {f.name: f for f in dataclasses.fields(cls) if "cli" in f.metadata}
    unknown = set(only or ()) - set(fields) | set(skip) - set(fields)
    if unknown:
        raise KeyError(f"{cls.__name__} has no option field(s) {sorted(unknown)}")
    names = [n for n in (only or fields) if n not in set(skip)]
    return [(fields[n], fields[n].metadata["cli"]) for n in names]
