"""The library behind every command: one function per operation (see :mod:`surgery` for the list)."""

from .baking import Baked, Planned, bake_plans, bake_recipe, bake_sweep, sweep_label
from .checkpoints import apply, inspect, undo, verify
from .directions import ablate_direction, direction_findings, find_direction
from .heads import amplify_heads, find_heads, head_findings, score_binding
from .neurons import find_neurons, neuron_findings, neuron_plans, prune_neurons
from .shipping import evaluate, export_lora, import_gguf, push, report, write_card

__all__ = [
    "Baked",
    "Planned",
    "ablate_direction",
    "amplify_heads",
    "apply",
    "bake_plans",
    "bake_recipe",
    "bake_sweep",
    "direction_findings",
    "evaluate",
    "export_lora",
    "find_direction",
    "find_heads",
    "find_neurons",
    "head_findings",
    "import_gguf",
    "inspect",
    "neuron_findings",
    "neuron_plans",
    "prune_neurons",
    "push",
    "report",
    "score_binding",
    "sweep_label",
    "undo",
    "verify",
    "write_card",
]
