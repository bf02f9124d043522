"""The library behind every command: one function per operation (see :mod:`surgery` for the list).

Names are imported on first use (PEP 562), so a command loads the operations it calls and no other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_attributes

# name → module of surgery.api that defines it
_EXPORTS = {
    "BakeOptions": "bake_options",
    "Callbacks": "callbacks",
    "FindingsSource": "findings_source",
    "EvalData": "eval_data",
    "EvalResult": "results",
    "ExportedLora": "results",
    "Inspection": "results",
    "Baked": "baking",
    "Planned": "baking",
    "bake_plans": "baking",
    "bake_recipe": "baking",
    "bake_sweep": "baking",
    "check_outputs": "baking",
    "sweep_label": "baking",
    "apply": "checkpoints",
    "inspect": "checkpoints",
    "undo": "checkpoints",
    "verify": "checkpoints",
    "ablate_direction": "directions",
    "direction_findings": "directions",
    "find_direction": "directions",
    "amplify_heads": "heads",
    "find_heads": "heads",
    "head_findings": "heads",
    "score_binding": "heads",
    "find_neurons": "neurons",
    "neuron_findings": "neurons",
    "neuron_plans": "neurons",
    "neuron_summary": "neurons",
    "prune_neurons": "neurons",
    "evaluate": "shipping",
    "export_lora": "shipping",
    "import_gguf": "shipping",
    "push": "shipping",
    "report": "shipping",
    "write_card": "shipping",
    "tune": "tuning",
    "Tuned": "tuning",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and documentation tools, which do not run __getattr__
    from .bake_options import BakeOptions
    from .baking import Baked, Planned, bake_plans, bake_recipe, bake_sweep, check_outputs, sweep_label
    from .callbacks import Callbacks
    from .checkpoints import apply, inspect, undo, verify
    from .directions import ablate_direction, direction_findings, find_direction
    from .eval_data import EvalData
    from .findings_source import FindingsSource
    from .heads import amplify_heads, find_heads, head_findings, score_binding
    from .neurons import find_neurons, neuron_findings, neuron_plans, neuron_summary, prune_neurons
    from .results import EvalResult, ExportedLora, Inspection
    from .shipping import evaluate, export_lora, import_gguf, push, report, write_card
    from .tuning import Tuned, tune


__getattr__ = lazy_attributes(__name__, {name: f".{module}" for name, module in _EXPORTS.items()}, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
