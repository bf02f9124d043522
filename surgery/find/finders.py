"""The finder registry: one :class:`Finder` per family (heads, neurons, directions), declared once.

A finder family is the findings kind it writes, the command that finds and the command that bakes
from its findings, the typed record of its findings file and the typed option objects of both
commands. The findings files' checks, the report, the library's option names and the command
line's flags read them from here, so a family is declared in its own package
(``surgery/find/<kind>/finder.py``, one :func:`register_finder` call) and nowhere else.

A family's module is imported on first use: asking for the neuron finder never imports the head
finders (the command line's start-up stays per command).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass, fields

from ..core.errors import SurgeryError

# The families shipped with surgery, by findings kind: their module registers them when imported.
BUILTIN = {
    "heads": "surgery.find.heads.finder",
    "neurons": "surgery.find.neurons.finder",
    "directions": "surgery.find.directions.finder",
}

_FINDERS: dict[str, Finder] = {}


@dataclass(frozen=True)
class Finder:
    """One finder family.

    Attributes:
        name: the findings kind it writes ("neurons"), the ``kind`` field of its findings files.
        find_command: the command that computes and caches the findings ("find-neurons").
        bake_command: the command that bakes an edit chosen from them ("prune-neurons").
        record: the typed record of its findings file (a subclass of ``surgery.find.findings.Findings``).
        params: the option objects that decide the findings (a changed field is another cache entry).
        bake_params: the option objects of the bake that choose from the findings, beyond ``params``.
    """

    name: str
    find_command: str
    bake_command: str
    record: type
    params: tuple[type, ...]
    bake_params: tuple[type, ...] = ()

    @property
    def option_types(self) -> tuple[type, ...]:
        """Every option object of its two commands, the finding ones first."""
        return self.params + self.bake_params

    def param_fields(self) -> frozenset[str]:
        """The names of the options that decide the findings (a bake given none of them takes the
        newest cached findings of the model)."""
        return frozenset(f.name for cls in self.params for f in fields(cls))


def register_finder(
    name: str,
    *,
    find_command: str,
    bake_command: str,
    record: type,
    params: tuple[type, ...],
    bake_params: tuple[type, ...] = (),
) -> Finder:
    """Declare a finder family under ``name`` (its findings kind) and return it; a name is taken once."""
    if name in _FINDERS:
        raise SurgeryError(f"two finders are named {name!r}; give the new one its own name")
    if getattr(record, "KIND", name) != name:
        raise SurgeryError(f"finder {name!r}: its record {record.__qualname__} is of kind {record.KIND!r}")
    found = Finder(name, find_command, bake_command, record, tuple(params), tuple(bake_params))
    _FINDERS[name] = found
    return found


def finder(name: str) -> Finder:
    """The finder family of findings kind ``name`` (its module imported on first use)."""
    if name not in _FINDERS and name in BUILTIN:
        importlib.import_module(BUILTIN[name])
    if name not in _FINDERS:
        raise SurgeryError(f"no finder writes {name!r} findings; the finders are: {', '.join(kinds())}")
    return _FINDERS[name]


def kinds() -> tuple[str, ...]:
    """The findings kinds of every finder family, the shipped ones first (in ``BUILTIN``'s order)."""
    return tuple(dict.fromkeys([*BUILTIN, *_FINDERS]))


def finders() -> Iterator[Finder]:
    """Every finder family (each module imported)."""
    return (finder(name) for name in kinds())
