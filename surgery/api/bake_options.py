"""What every bake is told beyond its edits: :class:`BakeOptions`, one object for the switches that
``prune_neurons``, ``amplify_heads``, ``ablate_direction``, ``apply`` and ``bake_recipe`` share (the
command line's ``--force``, ``--no-verify``, ``--allow-zero``, ``--allow-other-base``,
``--requantize``, ``--push-to``, ``--private``).

The flat keywords these functions took before (``force=True`` …) still work for one release: they
build the same object, with a DeprecationWarning that says what to write instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from ..core.errors import SurgeryError
from ._common import grouped

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class BakeOptions:
    """How a bake runs and where its result goes.

    Attributes:
        force: replace an existing ``out`` (only a surgery output, or an empty folder).
        verify: run the source once and check every edited weight map before publishing.
        allow_zero: accept a non-zero scale that rounds a head's or neuron's weights to zero.
        allow_other_base: bake a recipe written for another model (the output records both names).
        requantize: GGUF only: requantize the blocks an edit cannot change exactly, the error recorded.
        push_to: push the result to this Hub repo (a sweep: one branch per value).
        private: with ``push_to``: create the repo as private.
    """

    force: bool = False
    verify: bool = True
    allow_zero: bool = False
    allow_other_base: bool = False
    requantize: bool = False
    push_to: str | None = None
    private: bool = False


FIELDS = tuple(f.name for f in fields(BakeOptions))


def bake_options(function: str, given: BakeOptions | None, options: dict[str, Any]) -> BakeOptions:
    """``given`` (default: ``BakeOptions()``), or one built from the flat keywords of an older call
    (``force=True`` …), taken out of ``options`` with a DeprecationWarning saying what to write."""
    # stacklevel 5: the caller of the API function, past this function and its names_bake_options wrapper
    return grouped(function, BakeOptions, "bake", given, options, stacklevel=5)


def _bake_keyword(error: SurgeryError) -> Callable[[str], str]:
    """How a Python caller of a bake writes each named parameter: a switch that is a
    :class:`BakeOptions` field goes through ``bake=`` (``bake=surgery.BakeOptions(force=True)``)."""

    def spell(name: str) -> str:
        if name in error.switches and name in FIELDS:
            return f"bake=surgery.BakeOptions({name}=True)"
        return error.keyword(name)

    return spell


def names_bake_options(function: F) -> F:
    """``function`` (a bake's public entry point) with its errors naming a :class:`BakeOptions` switch as
    the caller writes it, ``bake=surgery.BakeOptions(force=True)``, where the code that raised it only
    knows the switch (``force=True``). The command line still reads the flag (``--force``)."""

    @functools.wraps(function)
    def named(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except SurgeryError as error:
            if error.switches & set(FIELDS):
                error.args = (error.spelled(_bake_keyword(error)),)
            raise

    return named  # type: ignore[return-value]
