"""The single map from an edit to the weight entries it acts on: its *sites*.

An edit is applied three ways: run-time hooks (``model.hooks.scale_vectors``), the bake's byte
plan (``bake.patches.plan``) and the exact LoRA export (``ship.lora.plan_ranks``). All three read
:func:`sites`; none of them decides by itself which module or which indices an edit touches.
Names and shapes come from :class:`~surgery.core.architectures.Architecture`, the owner of the table.

Two axes cover every edit so far:

* ``"in"``: input features of a linear map, i.e. weight columns. Scaling them is the same map as
  scaling the module's input, so a pre-hook (the twin) and a low-rank update (the LoRA) realise it
  exactly (``twin=True``).
* ``"out"``: output features, i.e. weight rows and the matching bias entries. Used only to make a
  pruned neuron dead in the weights too (its gate/up rows: act(0)·0 = 0, and its down_proj column
  is zero anyway), so the twin and the LoRA may skip it (``twin=False``).

A new kind of site (e.g. MoE expert neurons) plugs in as one more ``Edit`` type in edits.py, its
tensor names and shapes asked from ``Architecture`` (which grows them from ``Layout``), and one
more branch in :func:`sites` returning its ``Site`` list; the three consumers need no change while
the site is a weight's columns or rows. ``module`` is the in-memory module name relative to a
layer; where the on-disk tensor is named or laid out differently (fused expert tensors), that
translation belongs to ``Architecture`` and the byte plan asks it, not this map.

Routed-expert neurons are such sites: ``expert`` set, ``module`` the logical per-expert matrix
("mlp.experts.down" etc., [out, in] orientation). ``Architecture.expert_slices`` maps them to the
per-expert or fused 3-D tensors on disk; their twin is model/expert_twin.py (no Linear per expert
in memory), and the LoRA export refuses them. A shared expert's neurons are plain dense sites of
its own MLP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Literal

from .architectures import Architecture
from .edits import SHARED, Edit, HeadScale, NeuronScale

Axis = Literal["in", "out"]


@dataclass(frozen=True)
class Site:
    """One place an edit acts on, relative to decoder layer ``layer``."""

    layer: int
    module: str                 # e.g. "self_attn.o_proj", relative to the layer prefix
    axis: Axis                  # "in": weight columns; "out": weight rows (+ bias entries)
    indices: tuple[int, ...]
    scale: float
    shape: tuple[int, int]      # the weight's expected (rows, cols), from the geometry
    twin: bool                  # the run-time twin and the LoRA export realise this site
    # A routed expert's matrix: ``module`` is then "<experts module>.gate|up|down" in [out, in]
    # orientation, and Architecture.expert_slices says where it lies on disk (per-expert or fused).
    expert: int | None = None

    def __post_init__(self) -> None:
        # Hooks and LoRA scale a module's input: only column sites can be theirs.
        if self.twin and self.axis != "in":
            raise ValueError(f"site {self.module}: only input-feature ('in') sites have run-time twins")


def _head_sites(arch: Architecture, e: HeadScale) -> list[Site]:
    """A head is the d input columns of o_proj that carry its output."""
    o_proj = arch.layout.o_proj
    shape, _ = arch.attention_shapes()[o_proj]
    cols = arch.head_columns(e.head)
    return [Site(e.layer, o_proj, "in", tuple(range(cols.start, cols.stop)), e.alpha, shape, True)]


def _expert_sites(arch: Architecture, e: NeuronScale) -> list[Site]:
    """A routed expert's neuron: the same rule as a dense neuron, on that expert's matrices."""
    g, module = arch.geometry, arch.layout.experts.module
    H, I = g.hidden_size, g.expert_size
    out = [Site(e.layer, f"{module}.down", "in", (e.neuron,), e.factor, (H, I), True, e.expert)]
    if e.factor == 0.0:
        out += [Site(e.layer, f"{module}.{part}", "out", (e.neuron,), 0.0, (I, H), False, e.expert)
                for part in ("gate", "up")]
    return out


def _shared_sites(arch: Architecture, e: NeuronScale) -> list[Site]:
    """A shared-expert neuron: a dense neuron of the shared expert's own MLP."""
    g, shared = arch.geometry, arch.layout.experts.shared
    H, I = g.hidden_size, g.shared_size
    out = [Site(e.layer, f"{shared}.down_proj", "in", (e.neuron,), e.factor, (H, I), True)]
    if e.factor == 0.0:
        out += [Site(e.layer, f"{shared}.{m}", "out", (e.neuron,), 0.0, (I, H), False)
                for m in ("gate_proj", "up_proj")]
    return out


def _neuron_sites(arch: Architecture, e: NeuronScale) -> list[Site]:
    """A neuron is one input column of down_proj; pruned, also its rows of every MLP input matrix."""
    if e.expert == SHARED:
        return _shared_sites(arch, e)
    if e.expert is not None:
        return _expert_sites(arch, e)
    shapes = arch.mlp_shapes()
    down = arch.layout.down_proj
    out = [Site(e.layer, down, "in", (e.neuron,), e.factor, shapes[down], True)]
    if e.factor == 0.0:
        out += [Site(e.layer, m, "out", arch.neuron_rows(m, e.neuron), 0.0, shapes[m], False)
                for m in arch.mlp_input_modules()]
    return out


def sites(arch: Architecture, edit: Edit) -> list[Site]:
    """Where ``edit`` acts, in the order the bake checks and patches them; none for an identity."""
    if edit.is_identity():
        return []
    if isinstance(edit, HeadScale):
        return _head_sites(arch, edit)
    if isinstance(edit, NeuronScale):
        return _neuron_sites(arch, edit)
    raise TypeError(f"no sites known for {type(edit).__name__}")


def all_sites(arch: Architecture, edits: Iterable[Edit]) -> Iterator[Site]:
    """The sites of every edit, edit by edit."""
    for e in edits:
        yield from sites(arch, e)
