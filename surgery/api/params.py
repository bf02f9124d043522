"""The typed option objects the library takes, under one roof: the command line builds its flags
from their fields (surgery.cli.options) and hands the objects to the library unchanged; and the
finder families (:func:`finder`, surgery.find.finders) whose commands they belong to.

Names are imported on first use (PEP 562): a command that asks for the neuron options does not
import the head finder's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_attributes

# name → module that defines it
_EXPORTS = {
    "LoadSpec": "surgery.model.loading",
    "RUN_FIELDS": "surgery.model.loading",
    "FindParams": "surgery.find.heads.params",
    "PAIR_FIELDS": "surgery.find.heads.params",
    "SEARCH_FIELDS": "surgery.find.heads.params",
    "CaptureParams": "surgery.find.neurons.params",
    "SelectParams": "surgery.find.neurons.params",
    "DirectionParams": "surgery.find.directions.params",
    "KernelParams": "surgery.find.directions.params",
    "EvalParams": "surgery.evaluation.params",
    "TuneParams": "surgery.find.tune.params",
    "finder": "surgery.find.finders",
}
__all__ = sorted([*_EXPORTS, "GGUF_DTYPES"])

if TYPE_CHECKING:  # for type checkers and documentation tools, which do not run __getattr__
    from ..evaluation.params import EvalParams
    from ..find.directions.params import DirectionParams, KernelParams
    from ..find.finders import finder
    from ..find.heads.params import PAIR_FIELDS, SEARCH_FIELDS, FindParams
    from ..find.neurons.params import CaptureParams, SelectParams
    from ..find.tune.params import TuneParams
    from ..gguf.importing import DTYPES as GGUF_DTYPES
    from ..model.loading import RUN_FIELDS, LoadSpec

_lazy = lazy_attributes(__name__, _EXPORTS, globals())


def __getattr__(name: str) -> object:
    if name == "GGUF_DTYPES":  # import-gguf's --dtype choices, named for what they are out here
        from ..gguf.importing import DTYPES

        return DTYPES
    return _lazy(name)


def option_types() -> tuple[type, ...]:
    """Every option object a command builds from its flags: the load options, the evaluation's,
    and those of each finder family (surgery.find.finders), each family's module imported."""
    from ..evaluation.params import EvalParams
    from ..find.finders import finders
    from ..model.loading import LoadSpec

    return tuple(dict.fromkeys([LoadSpec, *(cls for f in finders() for cls in f.option_types), EvalParams]))


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
