"""The one place that knows where heads and neurons live in each architecture.

Everything else asks this table for tensor and module names. Supporting a new model_type means
adding a row to ``ARCHITECTURES`` (its group's ``table_*.py``), never a try/except elsewhere.

- :mod:`.layout`: the row type ``Layout`` and its parts (``Names``, ``Attention``, ``Mlp``, ``Layers``,
  ``Tail``, ``Limits``, ``Config``); :mod:`.experts`: its mixture of experts (``Experts``: ``ExpertKeys``,
  ``ExpertWeights``, ``SharedExpert``, ``SparseLayers`` with its ``StepRule``); :mod:`.records`: the
  records the parts hold (``ConfigKeys``, ``Mixer``, ``NativeName``, ``LayerSizes``); data only;
- :mod:`.kinds`: MLA and grouped-output shapes, hybrid layer kinds and how a config names them;
- :mod:`.parts`: pieces the rows share; :mod:`.table_base`, :mod:`.table_moe`, :mod:`.table_hybrid`,
  :mod:`.table_dense`, :mod:`.table_wrappers`: the rows by group, joined by :mod:`.table`;
- :mod:`.refusals`: the families refused, and the parts of a hybrid layer, each with its reason;
- :mod:`.geometry`: the sizes read from config.json; :mod:`.architecture`: a row with its sizes;
  :mod:`.expert_tensors`: where its experts' matrices lie on disk and in the loaded model.
"""

from .architecture import Architecture, LayerEdits, architecture, grouped_output_shapes, mla_shapes
from .experts import ExpertKeys, Experts, ExpertWeights, SharedExpert, SparseLayers, StepRule
from .geometry import Geometry
from .kinds import ATTENTION_KINDS, LEGACY_KINDS, GroupedOutput, KindRule, LayerKinds, Mla, MlaSizes, read_kinds
from .layout import TABLE_LOCATION, Attention, Config, Layers, Layout, Limits, Mlp, Names, Tail
from .records import ConfigKeys, LayerSizes, Mixer, NativeName
from .refusals import KIND_REFUSALS, REFUSED
from .table import ARCHITECTURES, model_class, refusal, text_config

__all__ = [
    "ARCHITECTURES",
    "ATTENTION_KINDS",
    "KIND_REFUSALS",
    "LEGACY_KINDS",
    "REFUSED",
    "TABLE_LOCATION",
    "Architecture",
    "Attention",
    "Config",
    "ConfigKeys",
    "ExpertKeys",
    "ExpertWeights",
    "Experts",
    "Geometry",
    "GroupedOutput",
    "KindRule",
    "LayerEdits",
    "LayerKinds",
    "LayerSizes",
    "Layers",
    "Layout",
    "Limits",
    "Mixer",
    "Mla",
    "MlaSizes",
    "Mlp",
    "Names",
    "NativeName",
    "SharedExpert",
    "SparseLayers",
    "StepRule",
    "Tail",
    "architecture",
    "grouped_output_shapes",
    "mla_shapes",
    "model_class",
    "read_kinds",
    "refusal",
    "text_config",
]
