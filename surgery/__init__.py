"""surgery: find the heads and neurons behind a behaviour, bake the edit into a checkpoint.

The Python API mirrors the ``surgery`` command line, one function per command::

    import surgery

    found = surgery.find_neurons("models/smollm2")                 # cached findings
    surgery.prune_neurons("models/smollm2", "pruned", n=40)          # surgery prune-neurons --n 40
    surgery.amplify_heads("models/smollm2", "amplified", alpha=2.5, heads=[(7, 7)])
    surgery.apply("recipe.yaml", "models/smollm2", "out", bake=surgery.BakeOptions(force=True))
    found = surgery.find_direction("models/smollm2", a="a.txt", b="b.txt")  # per-layer directions
    surgery.ablate_direction("models/smollm2", "ablated", direction=found.path, weight=1.0)
    assert surgery.verify("models/smollm2", "pruned").ok
    surgery.undo("pruned", "restored")
    tuned = surgery.tune("models/smollm2", findings="findings.json", trials=40, max_kl=0.05)

Options are keyword arguments named like the command line's (``device="cpu"``, ``score="bias"``,
``max_pairs=96``), checked as the command line checks them; a bake's switches (``--force``,
``--no-verify``, ``--push-to`` …) are one ``bake=surgery.BakeOptions(...)``. Everything listed in
``__all__`` is the supported surface; the modules below it may change. Names are imported on first
use, so ``import surgery`` stays cheap (no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import formats  # registers the stored formats that Checkpoint.format recognises
from .bake import folder_container, gguf_container  # registers the containers open_container picks from
from .core.lazy import lazy_attributes

__version__ = "0.1.0"

# name → module that defines it (imported on first access: PEP 562)
_EXPORTS = {
    # operations (surgery/api/)
    "find_direction": "surgery.api.directions",
    "ablate_direction": "surgery.api.directions",
    "direction_findings": "surgery.api.directions",
    "find_neurons": "surgery.api.neurons",
    "prune_neurons": "surgery.api.neurons",
    "neuron_findings": "surgery.api.neurons",
    "score_binding": "surgery.api.heads",
    "find_heads": "surgery.api.heads",
    "amplify_heads": "surgery.api.heads",
    "head_findings": "surgery.api.heads",
    "apply": "surgery.api.checkpoints",
    "verify": "surgery.api.checkpoints",
    "undo": "surgery.api.checkpoints",
    "inspect": "surgery.api.checkpoints",
    "export_lora": "surgery.api.shipping",
    "evaluate": "surgery.api.shipping",
    "push": "surgery.api.shipping",
    "write_card": "surgery.api.shipping",
    "report": "surgery.api.shipping",
    "import_gguf": "surgery.api.shipping",
    "bake_recipe": "surgery.api.baking",
    "bake_sweep": "surgery.api.baking",
    "tune": "surgery.api.tuning",
    "Tuned": "surgery.api.tuning",
    "TuneParams": "surgery.find.tune.params",
    # what they take and return
    "Recipe": "surgery.core.edits",
    "Edit": "surgery.core.edit_kind",
    "HeadScale": "surgery.core.edits",
    "NeuronScale": "surgery.core.edits",
    "DirectionEdit": "surgery.core.edits",
    "SteerEdit": "surgery.core.edits",
    "register_edit_kind": "surgery.core.edit_kind",
    "edit_kinds": "surgery.core.edit_kind",
    "LoadSpec": "surgery.model.loading",
    "CaptureParams": "surgery.find.neurons.params",
    "SelectParams": "surgery.find.neurons.params",
    "FindParams": "surgery.find.heads.params",
    "EvalParams": "surgery.evaluation.params",
    "DirectionParams": "surgery.find.directions.params",
    "KernelParams": "surgery.find.directions.params",
    "DirectionFindings": "surgery.find.directions.find",
    "Baked": "surgery.api.baking",
    "Planned": "surgery.api.baking",
    "BakeOptions": "surgery.api.bake_options",
    "Callbacks": "surgery.api.callbacks",
    "FindingsSource": "surgery.api.findings_source",
    "Inspection": "surgery.api.results",
    "EvalData": "surgery.api.eval_data",
    "EvalResult": "surgery.api.results",
    "ExportedLora": "surgery.api.results",
    "Report": "surgery.bake.verify",
    "NeuronFindings": "surgery.find.neurons.find",
    "HeadFindings": "surgery.find.heads.find",
    "SurgeryError": "surgery.core.errors",
    "ParameterError": "surgery.core.errors",
    "OptionError": "surgery.core.errors",
    "RecipeError": "surgery.core.errors",
    "CheckpointError": "surgery.core.errors",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and documentation tools, which do not run __getattr__
    from .api.bake_options import BakeOptions
    from .api.baking import Baked, Planned, bake_recipe, bake_sweep
    from .api.callbacks import Callbacks
    from .api.checkpoints import apply, inspect, undo, verify
    from .api.directions import ablate_direction, direction_findings, find_direction
    from .api.eval_data import EvalData
    from .api.findings_source import FindingsSource
    from .api.heads import amplify_heads, find_heads, head_findings, score_binding
    from .api.neurons import find_neurons, neuron_findings, prune_neurons
    from .api.results import EvalResult, ExportedLora, Inspection
    from .api.shipping import evaluate, export_lora, import_gguf, push, report, write_card
    from .api.tuning import Tuned, tune
    from .bake.verify import Report
    from .core.edit_kind import Edit, edit_kinds, register_edit_kind
    from .core.edits import DirectionEdit, HeadScale, NeuronScale, Recipe, SteerEdit
    from .core.errors import CheckpointError, OptionError, ParameterError, RecipeError, SurgeryError
    from .evaluation.params import EvalParams
    from .find.directions.find import DirectionFindings
    from .find.directions.params import DirectionParams, KernelParams
    from .find.heads.find import HeadFindings
    from .find.heads.params import FindParams
    from .find.neurons.find import NeuronFindings
    from .find.neurons.params import CaptureParams, SelectParams
    from .find.tune.params import TuneParams
    from .model.loading import LoadSpec


__getattr__ = lazy_attributes(__name__, _EXPORTS, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
