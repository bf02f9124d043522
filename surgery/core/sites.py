"""The single map from an edit to the weight entries it acts on: its *sites*.

An edit is applied three ways: run-time hooks (``model.hooks.scale_vectors``), the bake's byte
plan (``core.patches.patch_plan``) and the exact LoRA export (``bake.lora.plan_ranks``). All three read
:func:`sites`; none of them decides by itself which module or which indices an edit touches.
Names and shapes come from :class:`~surgery.core.architectures.Architecture`, the owner of the table.

Two axes cover every edit so far:

* ``"in"``: input features of a linear map, i.e. weight columns. Scaling them is the same map as
  scaling the module's input, so a pre-hook (the twin) and a low-rank update (the LoRA) realise it
  exactly (``twin=True``).
* ``"out"``: output features, i.e. weight rows and the matching bias entries. Used only to make a
  pruned neuron dead in the weights too (its gate/up rows: act(0)·0 = 0, and its down_proj column
  is zero anyway), so the twin and the LoRA may skip it (``twin=False``).

Each edit kind (surgery/core/edit_kind.py) says where its edits act (``Edit.sites``); the three
consumers need no change while a site is a weight's columns or rows. ``module`` is the in-memory
module name relative to a layer; where the on-disk tensor is named or laid out differently (fused
expert tensors), that translation belongs to ``Architecture`` and the byte plan asks it, not this map.

A third kind of site is not a scale: a **projection** (``op="project"``) rewrites a whole matrix
that writes into the residual stream, W ← W − w·r(rᵀW) with r a unit vector (``direction``) and w
the site's ``scale``: the direction r is removed from (w = 1) or scaled in (w ≠ 1) everything the
module writes. ``axis`` then says which axis of the stored weight is the residual stream: ``"out"``
(its rows, an output projection such as o_proj or down_proj, and its bias) or ``"in"`` (its
columns, the [vocab, hidden] embedding table). Its twin projects the module's output,
y ← y − w·r(rᵀy), the same map; its LoRA is rank 1 (A = rᵀW, B = −w·r). A site with ``layer``
None sits next to the layer list (the embeddings).

A fourth is an **addition** (``op="add"``, a steer edit): b ← b + c·r on the output bias of a
residual writer (``axis`` "out", c the site's ``scale``), so that the module writes c·r more whatever
its input (a control vector). Its twin adds c·r to the module's output; it has no LoRA (an adapter
cannot change a bias), and a module with no bias in the checkpoint is refused (the resolver).

Routed-expert neurons are such sites: ``expert`` set, ``module`` the logical per-expert matrix
("mlp.experts.down" etc., [out, in] orientation). ``Architecture.expert_slices`` maps them to the
per-expert or fused 3-D tensors on disk; their twin is model/expert_twin.py (no Linear per expert
in memory), and the LoRA export refuses them. A shared expert's neurons are plain dense sites of
its own MLP.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from .architectures import Architecture
from .errors import RecipeError

Axis = Literal["in", "out"]
Op = Literal["scale", "project", "add"]


@dataclass(frozen=True)
class Site:
    """One place an edit acts on, relative to decoder layer ``layer``."""

    layer: int | None  # None: a module next to the layer list (the embeddings)
    module: str  # e.g. "self_attn.o_proj", relative to the layer prefix
    axis: Axis  # "in": weight columns; "out": weight rows (+ bias entries)
    indices: tuple[int, ...]
    scale: float
    shape: tuple[int, int]  # the weight's expected (rows, cols), from the geometry
    twin: bool  # the run-time twin and the LoRA export realise this site
    # A routed expert's matrix: ``module`` is then "<experts module>.gate|up|down" in [out, in]
    # orientation, and Architecture.expert_slices says where it lies on disk (per-expert or fused).
    expert: int | None = None
    # (group, groups): ``module`` is a grouped linear (DeepSeek-V4's o_a_proj) whose input is
    # [..., groups, shape[1]] and whose rows are ``groups`` equal blocks, block g reading input group g.
    # The site's columns are then those of block ``group`` only (Architecture.head_group).
    group: tuple[int, int] | None = None
    op: Op = "scale"  # "project": W ← W − scale·r(rᵀW) along ``axis``; "add": b ← b + scale·r (the docstring)
    direction: bytes | None = None  # the unit vector r, float32 bytes (None: not read yet)

    @property
    def rows(self) -> tuple[int, int] | None:
        """(first row, number of rows) of the block a grouped site's columns lie in; None: all rows."""
        if self.group is None:
            return None
        g, groups = self.group
        block = self.shape[0] // groups
        return g * block, block

    def __post_init__(self) -> None:
        # Scale hooks and LoRA scale a module's input: only column sites can be theirs.
        if self.twin and self.op == "scale" and self.axis != "in":
            raise ValueError(f"site {self.module}: only input-feature ('in') sites have run-time twins")

    def unit(self) -> np.ndarray:
        """The projection's (or addition's) unit vector r (float32)."""
        if self.direction is None:
            raise RecipeError(
                f"the direction of '{self.module}' was not read; load the recipe from its file "
                "(Recipe.load), or give Recipe.from_dict the folder of its vector files"
            )
        return np.frombuffer(self.direction, dtype=np.float32)


class Sited(Protocol):
    """What the site map needs of an edit (every kind of surgery/core/edit_kind.py has it)."""

    def is_identity(self) -> bool: ...

    def sites(self, arch: Architecture) -> list[Site]: ...


def sites(arch: Architecture, edit: Sited) -> list[Site]:
    """Where ``edit`` acts, in the order the bake checks and patches them; none for an identity."""
    return [] if edit.is_identity() else edit.sites(arch)


def all_sites(arch: Architecture, edits: Iterable[Sited]) -> Iterator[Site]:
    """The sites of every edit, edit by edit."""
    for e in edits:
        yield from sites(arch, e)


def _indices(idx: tuple[int, ...]) -> str:
    if len(idx) > 2 and list(idx) == list(range(idx[0], idx[-1] + 1)):
        return f"{idx[0]}–{idx[-1]}"
    return ", ".join(map(str, idx))


def where_text(arch: Architecture, edit: Sited, twin_only: bool = False) -> str:
    """The weight entries ``edit`` changes, named as in this model, e.g.
    "`mlp.down_proj` column 17; `mlp.gate_up_proj` rows 17, 8209" (model cards); ``twin_only``: the
    sites with a run-time twin alone (what a LoRA adapter changes)."""
    parts = []
    for site in sites(arch, edit):
        if twin_only and not site.twin:
            continue
        module = site.module if site.layer is None else arch.block(site.layer, site.module)[1]  # LongCat's blocks
        if site.op != "scale":
            name = f"`{module}`" if site.expert is None else "every routed expert's down matrix"
            name += " bias" if site.op == "add" else ""
            if name not in parts:  # one phrase for all the experts of a layer
                parts.append(name)
            continue
        kind = "column" if site.axis == "in" else "row"
        # A routed expert's matrix is a logical one (per-expert or fused tensors on disk): named by its part.
        part = site.module.rsplit(".", 1)[-1]  # a dense module may sit on the layer itself (OPT's fc1)
        name = f"`{module}`" if site.expert is None else f"expert {site.expert}'s {part} matrix"
        parts.append(f"{name} {kind}{'s' if len(site.indices) > 1 else ''} {_indices(site.indices)}")
    return "; ".join(parts)
