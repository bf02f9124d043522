"""A recipe as edited blocks of a GGUF file: which blocks of which tensors, and their new bytes.

The recipe's sites (surgery/core/sites.py) are resolved to transformers tensor names by the one
resolver (surgery/core/resolve.py), then to GGUF names by gguf-py's map. A tensor is viewed as rows
of blocks (GGUF rows are contiguous: ``in / block values`` blocks each); a site's rows are whole
rows, its columns the blocks that hold them, in every row. Only ``attn_output`` and the FFN tensors
are ever edited: llama.cpp permutes the rows of ``attn_q`` / ``attn_k``, which no edit touches.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ..core.counted import counted
from ..core.edits import Recipe
from ..core.errors import CheckpointError, RecipeError
from ..core.resolve import Resolver, TensorSlice
from ..core.sites import sites
from .blocks import Edited, PartialEdit, block_type
from .blocks.base import IMPORT
from .header import GgufTensor
from .model import GgufModel

READ_SPAN = 4 << 20  # the most bytes one read of edited blocks spans (the blocks and the gaps between them)

# What a refusal of a part-of-a-block edit says, by the edit kind that scales the columns: a neuron's
# down column is one value of a block in every row whatever the user picks, and a head's columns
# cover part of a block by the model's head_dim, so "whole blocks" is no choice the user has.
PARTIAL = {
    "neuron": PartialEdit(
        "a neuron's factor other than 0 (on its down-projection column, one value of each row)",
        ("prune the neuron instead (factor 0 is exact)", IMPORT),
    ),
    "head": PartialEdit("a head's α (on its head_dim columns of each row)"),
}


@dataclass
class TensorEdit:
    """The factors one tensor's rows and columns are multiplied by.

    ``cols`` maps a slab of rows (first row, number of rows) to the factors of its columns: the whole
    tensor for a dense matrix, one expert's [out, in] slab of a stacked 3-D tensor for a routed one.
    """

    tensor: GgufTensor
    rows: dict[int, float] = field(default_factory=dict)
    cols: dict[tuple[int, int], dict[int, float]] = field(default_factory=dict)
    col_kinds: set[str] = field(default_factory=set)  # the kinds of the edits that scale columns

    def partial(self) -> PartialEdit:
        """How a refusal names this tensor's edit where it scales part of a block."""
        kind = next(iter(self.col_kinds)) if len(self.col_kinds) == 1 else ""
        return PARTIAL.get(kind, PartialEdit())

    @property
    def matrix(self) -> tuple[int, int]:
        """(rows, values per row): a 1-D tensor (a bias) is one value per row."""
        shape = self.tensor.shape
        return (shape[0], 1) if len(shape) == 1 else (int(np.prod(shape[:-1])), shape[-1])

    @property
    def columns(self) -> list[int]:
        """Every column scaled in some slab (the record's summary)."""
        return sorted({c for cols in self.cols.values() for c in cols})

    def scale_cols(self, first: int, count: int, cols: tuple[int, ...], scale: float) -> None:
        """Multiply ``cols`` of the rows [first, first + count) by ``scale``."""
        slab = self.cols.setdefault((first, count), {})
        for c in cols:
            slab[c] = slab.get(c, 1.0) * scale

    def units(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(file offsets, row, block index) of every block the edit changes, in file order."""
        values, nbytes = block_type(self.tensor.type, self.tensor.name).block_shape
        per_row = self.matrix[1] // values
        whole = np.array(sorted(self.rows), dtype=np.int64)
        keys = [(whole[:, None] * per_row + np.arange(per_row)).reshape(-1)]
        for (first, count), cols in self.cols.items():
            col_blocks = np.array(sorted({c // values for c in cols}), dtype=np.int64)
            others = np.setdiff1d(np.arange(first, first + count), whole)
            keys.append((others[:, None] * per_row + col_blocks).reshape(-1))
        key = np.unique(np.concatenate(keys))  # sorted: file order
        rows, blocks = key // per_row, key % per_row
        offsets = self.tensor.offset + key * nbytes
        return offsets.astype(np.int64), rows, blocks

    def factors(self, rows: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """(U, block values) float64: what each value of each unit is multiplied by."""
        values, _ = block_type(self.tensor.type, self.tensor.name).block_shape
        n_in = self.matrix[1]
        out = np.array([self.rows.get(int(r), 1.0) for r in rows])[:, None] * np.ones((1, values))
        for (first, count), cols in self.cols.items():
            col = np.ones(n_in)
            for c, f in cols.items():
                col[c] *= f
            here = (rows >= first) & (rows < first + count)
            out[here] *= col.reshape(-1, values)[blocks[here]]
        return out


@dataclass
class GgufPlan:
    """Every tensor edit of a recipe, and notes on what was left as is (and why)."""

    edits: list[TensorEdit]
    notes: list[str] = field(default_factory=list)


def plan_gguf(model: GgufModel, recipe: Recipe) -> GgufPlan:
    """The tensor edits ``recipe`` makes in ``model``'s file (one-line errors for what it cannot edit)."""
    arch = model.arch
    resolver = Resolver(arch, model.hf_names())
    by_name: dict[str, TensorEdit] = {}
    kept: dict[str, int] = {}  # type -> down columns left as is
    for edit in recipe.active():
        edit_sites = sites(arch, edit)
        silenced = any(s.axis == "out" and s.scale == 0.0 for s in edit_sites)  # a pruned neuron's input rows
        if any(s.op == "add" for s in edit_sites):  # a sum, not a scale: no block's scale can carry it
            raise RecipeError(
                f"{model.path.name}: a steer edit adds a vector to biases, which a GGUF block's scale "
                "cannot express; import it (surgery import-gguf) and bake the checkpoint"
            )
        if any(s.expert is not None for s in edit_sites) and not model.expert_names():
            raise RecipeError(
                f"{model.path.name}: surgery cannot match this {arch.model_type} file's routed experts to "
                "llama.cpp's stacked ffn_*_exps tensors (its table has no per-expert names for them, or the "
                "file lacks the stacks); import it (surgery import-gguf) and bake the checkpoint"
            )
        for piece in resolver.all(edit_sites):
            if piece.site.op == "project":  # a whole matrix changes: no block's scale can carry it
                raise RecipeError(
                    f"{model.path.name}: a direction edit rewrites whole matrices, which a GGUF block "
                    "cannot store exactly; import it (surgery import-gguf) and bake the checkpoint"
                )
            if piece.window is not None:
                raise RecipeError(
                    f"{model.path.name}: this edit scales a group of outputs within a block of rows "
                    f"({model.arch.model_type}), which surgery does not map onto GGUF tensors yet; import it "
                    "(surgery import-gguf) and bake the checkpoint"
                )
            t, first, count = _stored(model, piece)
            stored = block_type(t.type, t.name)  # refused in one line when no block type edits it
            if not piece.as_rows and silenced and piece.scale == 0.0 and not stored.zeroes_values:
                # The zero gate/up rows already silence the neuron (act(0)·0 = 0): the down column is not needed.
                kept[t.type] = kept.get(t.type, 0) + len(piece.lines)
                continue
            te = by_name.setdefault(t.name, TensorEdit(t))
            if not piece.as_rows:
                te.scale_cols(first, count, piece.lines, piece.scale)
                te.col_kinds.add(edit.kind)
                continue
            for i in piece.lines:
                te.rows[first + i] = te.rows.get(first + i, 1.0) * piece.scale
            if not piece.is_bias:
                bias = model.header.tensors.get(t.name.removesuffix(".weight") + ".bias")
                if bias is not None:  # an output feature's bias entry goes with its row
                    block_type(bias.type, bias.name)  # refused in one line when no block type edits it
                    be = by_name.setdefault(bias.name, TensorEdit(bias))
                    for i in piece.lines:
                        be.rows[first + i] = be.rows.get(first + i, 1.0) * piece.scale
    notes = [
        f"{counted(n, 'down-projection column')} stored as {kind} left as is: {kind} cannot zero a single value "
        "exactly; the pruned neurons' zero gate/up rows already silence them"
        for kind, n in sorted(kept.items())
    ]
    return GgufPlan(sorted(by_name.values(), key=lambda e: e.tensor.offset), notes)


def _stored(model: GgufModel, piece: TensorSlice) -> tuple[GgufTensor, int, int]:
    """The GGUF tensor a slice lies in, and the first row and number of rows of its slab there (a
    routed expert's matrix is one expert's slab of llama.cpp's stacked [E, out, in] tensor)."""
    site = piece.site
    if site.expert is None:
        t = model.tensor(piece.tensor)
        if len(t.shape) == 2 and t.shape != tuple(piece.shape):
            raise CheckpointError(
                f"{model.path.name}: {t.name} has shape {list(t.shape)}, the config says "
                f"{list(piece.shape)}; the file does not match its metadata"
            )
        return t, 0, TensorEdit(t).matrix[0]
    E = model.arch.geometry.num_experts
    if not 0 <= site.expert < E:
        raise RecipeError(
            f"expert {site.expert} of layer {site.layer} does not exist: {model.path.name} has {E} routed "
            f"experts per layer (0 to {E - 1}); fix the recipe's expert index"
        )
    part = site.module.rsplit(".", 1)[1]
    t, first = model.expert_tensor(piece.tensor, site.expert, part, piece.shape)
    return t, first, piece.shape[0]


def read_units(fd: int, offsets: np.ndarray, nbytes: int) -> np.ndarray:
    """The bytes (U, nbytes) of the blocks at ``offsets`` (sorted), one read per :func:`spans` range."""
    out = np.empty((len(offsets), nbytes), dtype=np.uint8)
    for a, b in spans(offsets, nbytes):
        start = int(offsets[a])
        want = int(offsets[b - 1]) + nbytes - start
        data = os.pread(fd, want, start)
        if len(data) != want:
            raise CheckpointError("the GGUF file ended inside an edited tensor; it is truncated: download it again")
        out[a:b] = np.frombuffer(data, dtype=np.uint8)[(offsets[a:b] - start)[:, None] + np.arange(nbytes)]
    return out


def spans(offsets: np.ndarray, nbytes: int) -> list[tuple[int, int]]:
    """[start, end) index ranges of ``offsets`` (sorted) read at once: contiguous runs of blocks, joined while
    the bytes from the first block to the last stay within :data:`READ_SPAN`. A pruned neuron's down column
    is a block in every row, so one read a run was a system call per block (24k for 40 neurons on
    SmolLM2); the bytes between them are read and dropped instead."""
    joined: list[tuple[int, int]] = []
    for a, b in runs(offsets, nbytes):
        if joined and int(offsets[b - 1]) + nbytes - int(offsets[joined[-1][0]]) <= READ_SPAN:
            joined[-1] = (joined[-1][0], b)
        else:
            joined.append((a, b))
    return joined


def runs(offsets: np.ndarray, nbytes: int) -> list[tuple[int, int]]:
    """[start, end) index ranges of ``offsets`` whose blocks are adjacent in the file."""
    if not len(offsets):
        return []
    breaks = np.nonzero(np.diff(offsets) != nbytes)[0] + 1
    edges = [0, *breaks.tolist(), len(offsets)]
    return list(zip(edges[:-1], edges[1:]))


@dataclass
class EditedBlocks:
    """One tensor's edited blocks: where, their original and new bytes, what requantizing cost."""

    edit: TensorEdit
    offsets: np.ndarray
    original: np.ndarray
    result: Edited

    def chunks(self) -> Iterator[tuple[int, memoryview]]:
        """(offset, new bytes) per contiguous run of edited blocks, in file order."""
        nbytes = self.original.shape[1]
        for a, b in runs(self.offsets, nbytes):
            yield int(self.offsets[a]), memoryview(np.ascontiguousarray(self.result.blocks[a:b]).reshape(-1))


def edit_tensor(fd: int, te: TensorEdit, requantize: bool, original: np.ndarray | None = None) -> EditedBlocks:
    """Read ``te``'s blocks from ``fd`` (or take ``original``) and compute their new bytes."""
    offsets, rows, blocks = te.units()
    kind = block_type(te.tensor.type, te.tensor.name)
    old = read_units(fd, offsets, kind.block_shape[1]) if original is None else original
    return EditedBlocks(
        te, offsets, old, kind.edit(old, te.factors(rows, blocks), te.tensor.name, requantize, te.partial())
    )
