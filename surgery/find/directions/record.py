"""Direction findings as a typed record: the two prompt sets, each layer's direction statistics, the
cosines between layers, the best layer and the vectors file that goes with the JSON.

:class:`DirectionsFindings` is the findings file of ``surgery find-direction`` (its common head is
:class:`surgery.find.findings.Findings`). The vectors themselves (``layer.L``, ``mean_a.L``,
``mean_b.L``) are in a safetensors file next to the JSON, which ``vectors`` names and pins by sha256.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from ...core.edit_kind import layer_list
from ...core.json_record import Codec, JsonRecord, entry, listof, part
from ..findings import Findings


@dataclass(kw_only=True)
class PromptFile(JsonRecord):
    """One side's prompt file: its name, how many prompts it holds, and its sha256."""

    file: str
    prompts: int
    sha256: str


@dataclass(kw_only=True)
class DirectionsDataset(JsonRecord):
    """The two prompt sets (``a`` shows the behaviour, ``b`` does not), and whether the prompts went
    through the model's chat template."""

    a: PromptFile = entry(codec=part(PromptFile))
    b: PromptFile = entry(codec=part(PromptFile))
    chat_template: bool | None = None


# Cohen's d of two sets without variance along the direction is infinite; JSON has no infinity, so
# the file holds null (surgery.core.finite_json), read back as what it was.
UNBOUNDED = Codec(lambda raw, at: math.inf if raw is None else raw, lambda value: value)


@dataclass(kw_only=True)
class LayerDirection(JsonRecord):
    """One layer's direction, mean(a) − mean(b): its norm, the norms of the two means, and how well
    the unit direction separates the two sets (Cohen's d; the midpoint threshold's accuracy)."""

    layer: int
    norm: float
    norm_a: float | None = None
    norm_b: float | None = None
    separation: float = entry(codec=UNBOUNDED)
    accuracy: float | None = None


@dataclass(kw_only=True)
class VectorsFile(JsonRecord):
    """The safetensors file of the vectors, next to the findings JSON, and its sha256."""

    file: str
    sha256: str


@dataclass(kw_only=True)
class DirectionsFindings(Findings):
    """The findings file of find-direction (see the module docstring)."""

    kind: str = "directions"
    dataset: DirectionsDataset | None = entry(codec=part(DirectionsDataset), default=None)
    best_layer: int
    layers: list[LayerDirection] = entry(codec=listof(part(LayerDirection)))
    cosine: list[list[float]]  # layers × layers, between the unit directions
    vectors: VectorsFile | None = entry(codec=part(VectorsFile), default=None)  # set once the vectors are written

    KIND: ClassVar[str] = "directions"

    def best_layers(self) -> list[int]:
        """The layers that separate the two sets best: ``best_layer`` alone, unless others tie with it
        (every layer infinite when each set is one prompt: no spread to divide by)."""
        top = next((row.separation for row in self.layers if row.layer == self.best_layer), None)
        return [row.layer for row in self.layers if row.separation == top] or [self.best_layer]

    def best_words(self) -> str:
        """The best layer as the command and the report say it (lower case): ``best separation at
        layer 7``, or, where layers tie (:meth:`best_layers`), that there is none."""
        tied = self.best_layers()
        if len(tied) == 1:
            return f"best separation at layer {self.best_layer}"
        return f"layers {layer_list(tied)} separate equally well (no spread within a set): no best layer"
