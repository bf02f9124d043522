"""What every API function shares: flat keyword options into typed parameter objects, and notes.

The Python API mirrors the command line: ``surgery.prune_neurons(model, out, n=40, score="bias",
device="cpu")`` takes the same options as ``surgery prune-neurons MODEL --n 40 --score bias
--device cpu``, spelled as the fields of the typed parameter objects (``LoadSpec``,
``CaptureParams``, ``SelectParams``, ``FindParams``, ``EvalParams``, ``FindingsSource``,
``EvalData``). A ready object may be given instead (``load=LoadSpec(...)``). Bounds and choices
are checked by the objects themselves, so a Python caller gets the command line's errors. Two
objects are given whole, ``BakeOptions`` (a bake's switches) and ``Callbacks`` (progress, notes,
hooks): their flat keywords of earlier releases still work and warn (:func:`grouped`).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import warnings
from collections.abc import Callable, Iterable
from numbers import Integral
from pathlib import Path
from typing import Any, TypeVar

from ..core.counted import in_number
from ..core.errors import ParameterError, what_was_given

T = TypeVar("T")

logger = logging.getLogger("surgery")


def log_note(message: str) -> None:
    """The default ``report`` of API functions: a note on the ``surgery`` logger (warning level, so
    that Python's last-resort handler shows it on stderr when logging is not configured)."""
    logger.warning(message)


def typed(cls: type[T], options: dict[str, Any], given: T | None = None) -> T:
    """``given``, or ``cls`` built from the options named like its fields (taken out of ``options``)."""
    names = {f.name for f in dataclasses.fields(cls)}
    mine = {k: options.pop(k) for k in list(options) if k in names}
    if given is not None:
        if not isinstance(given, cls):
            raise ParameterError(_not_the_object(cls, given))
        if mine:
            raise TypeError(f"give either a {cls.__name__} or its options ({', '.join(sorted(mine))}), not both")
        return given
    return cls(**mine)


def _not_the_object(cls: type, given: Any) -> str:
    """Why ``given`` is refused where a ``cls`` belongs (a dict of its options, a bare switch …): read
    as one, it would fail later on a missing attribute, deep in the code that uses it."""
    if isinstance(given, dict) and all(isinstance(k, str) for k in given):
        fields = ", ".join(f"{k}={v!r}" for k, v in given.items())
        return f"got a dict where a surgery.{cls.__name__} belongs; write surgery.{cls.__name__}({fields})"
    return (
        f"got {type(given).__name__} {given!r} where a surgery.{cls.__name__} belongs; write surgery.{cls.__name__}(…)"
    )


def grouped(
    function: str,
    cls: type[T],
    keyword: str,
    given: T | None,
    options: dict[str, Any],
    *,
    values: bool = True,
    stacklevel: int = 4,
) -> T:
    """``given`` (default: ``cls()``), or one built from the flat keywords of an older call that are
    ``cls``'s fields, taken out of ``options`` with a DeprecationWarning saying what to write instead:
    ``function(…, keyword=surgery.Cls(name=value))`` (``values``: show the values given, else ``…``;
    ``stacklevel``: where the caller's line is, past the API function and its wrappers)."""
    old = {f.name: options[f.name] for f in dataclasses.fields(cls) if f.name in options}
    chosen = typed(cls, options, given)
    if old:
        written = ", ".join(f"{name}={value!r}" if values else f"{name}=…" for name, value in old.items())
        warnings.warn(
            f"{function}({', '.join(f'{name}=…' for name in old)}) is deprecated and will be removed in the "
            f"next release; write {function}(…, {keyword}=surgery.{cls.__name__}({written})) instead",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
    return chosen


def no_other_options(
    function: str, options: dict[str, Any], *accepted: type, handed_to: Callable[..., Any] | None = None
) -> None:
    """A keyword none of the ``accepted`` parameter objects has is a typo: say which, and what is
    accepted. Called with what the objects left, or up front by a function that hands its options
    on to ``handed_to`` (whose own keywords, ``load=`` …, are accepted too), so that the typo is
    named as the caller's, not the helper's."""
    known = {f.name for cls in accepted for f in dataclasses.fields(cls)}
    own = set(inspect.signature(handed_to).parameters) if handed_to is not None else set()
    if unknown := sorted(set(options) - known - own):
        raise TypeError(
            f"{function}() got unknown {in_number(len(unknown), 'option')} {', '.join(unknown)}; it also takes: {', '.join(sorted(known))}"
        )


def reporter(report: Callable[[str], None] | None) -> Callable[[str], None]:
    """``report``, or notes on the ``surgery`` logger."""
    return report or log_note


def index_pair(item: Any, name: str, shape: str, example: str) -> tuple[int, int]:
    """``item`` as a pair of whole numbers (``shape`` names its parts, e.g. "(layer, head)"); any other
    shape is a one-line ParameterError naming the parameter ``name`` and an ``example`` of it."""
    try:
        pair = () if isinstance(item, (str, bytes)) else tuple(item)  # a list, tuple, numpy row …
    except TypeError:  # not iterable: a number
        pair = ()
    if len(pair) != 2 or not all(isinstance(x, Integral) and not isinstance(x, bool) for x in pair):
        raise ParameterError(f"{{{name}}}: {item!r} is not a {shape} pair of whole numbers; give e.g. {example}", name)
    return int(pair[0]), int(pair[1])


def given_path(value: Any, name: str) -> Path:
    """A file or folder given to an API function, with ``~`` expanded as a shell would (the command
    line gets it expanded; a Python string is read as written); anything but a str or os.PathLike is
    a one-line ParameterError naming the parameter."""
    if not isinstance(value, (str, os.PathLike)):
        raise ParameterError(f"{{{name}}} must be a path (a str or pathlib.Path), got {what_was_given(value)}", name)
    return Path(value).expanduser()


def given_paths(values: Any, name: str) -> list[Path]:
    """``values`` as paths: a list of them, or one path alone (not iterated letter by letter)."""
    if isinstance(values, (str, os.PathLike)):
        return [given_path(values, name)]
    if not isinstance(values, Iterable):
        raise ParameterError(
            f"{{{name}}} must be paths (a list of str or pathlib.Path), got {what_was_given(values)}", name
        )
    return [given_path(v, name) for v in values]
