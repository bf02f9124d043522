"""The records the library's finders return and write, and the readings the command line prints of
them (caveats, metric labels): everything a caller reads, so that the command line needs only the
library and core.

Names are imported on first use (PEP 562): reading a neuron record does not import the head finder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_attributes

# name → module that defines it
_EXPORTS = {
    "BindingScores": "surgery.find.heads.record",
    "Confirmation": "surgery.find.heads.record",
    "HeadsFindings": "surgery.find.heads.record",
    "delta_s_caveat": "surgery.core.heads_caveats",
    "weak_heads_caveat": "surgery.core.heads_caveats",
    "CategoryOverlap": "surgery.find.neurons.record",
    "ExpertReport": "surgery.find.neurons.record",
    "NeuronsDataset": "surgery.find.neurons.record",
    "NeuronSelection": "surgery.find.neurons.record",
    "DirectionsFindings": "surgery.find.directions.record",
    "Trial": "surgery.find.tune.record",
    "TuneRecord": "surgery.find.tune.record",
    "metric_info": "surgery.core.evaluation_result",
    "clean": "surgery.core.evaluation_result",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and documentation tools, which do not run __getattr__
    from ..core.evaluation_result import clean, metric_info
    from ..core.heads_caveats import delta_s_caveat, weak_heads_caveat
    from ..find.directions.record import DirectionsFindings
    from ..find.heads.record import BindingScores, Confirmation, HeadsFindings
    from ..find.neurons.record import CategoryOverlap, ExpertReport, NeuronsDataset, NeuronSelection
    from ..find.tune.record import Trial, TuneRecord

__getattr__ = lazy_attributes(__name__, _EXPORTS, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
