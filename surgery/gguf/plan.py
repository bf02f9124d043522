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

from ..core.edits import Recipe
from ..core.errors import CheckpointError, RecipeError
from ..core.resolve import Resolver
from ..core.sites import sites
from ..model.gguf_import import GgufTensor
from .formats import ELEMENT_ZERO, FLOATS, Edited, block_shape, check_supported, edit_blocks
from .model import GgufModel


@dataclass
class TensorEdit:
    """The factors one tensor's rows and columns are multiplied by."""

    tensor: GgufTensor
    rows: dict[int, float] = field(default_factory=dict)
    cols: dict[int, float] = field(default_factory=dict)

    @property
    def matrix(self) -> tuple[int, int]:
        """(rows, values per row): a 1-D tensor (a bias) is one value per row."""
        shape = self.tensor.shape
        return (shape[0], 1) if len(shape) == 1 else (int(np.prod(shape[:-1])), shape[-1])

    def units(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(file offsets, row, block index) of every block the edit changes, in file order."""
        values, nbytes = block_shape(self.tensor.type)
        n_rows, n_in = self.matrix
        per_row = n_in // values
        col_blocks = np.array(sorted({c // values for c in self.cols}), dtype=np.int64)
        whole = np.array(sorted(self.rows), dtype=np.int64)
        others = np.setdiff1d(np.arange(n_rows), whole) if len(col_blocks) else np.zeros(0, np.int64)
        rows = np.concatenate([np.repeat(whole, per_row), np.repeat(others, len(col_blocks))])
        blocks = np.concatenate([np.tile(np.arange(per_row), len(whole)), np.tile(col_blocks, len(others))])
        order = np.lexsort((blocks, rows))
        rows, blocks = rows[order], blocks[order]
        offsets = self.tensor.offset + rows * (per_row * nbytes) + blocks * nbytes
        return offsets.astype(np.int64), rows, blocks

    def factors(self, rows: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """(U, block values) float64: what each value of each unit is multiplied by."""
        values, _ = block_shape(self.tensor.type)
        n_in = self.matrix[1]
        col = np.ones(n_in)
        for c, f in self.cols.items():
            col[c] *= f
        row = np.array([self.rows.get(int(r), 1.0) for r in rows])
        return row[:, None] * col.reshape(-1, values)[blocks]


@dataclass
class Plan:
    """Every tensor edit of a recipe, and notes on what was left as is (and why)."""

    edits: list[TensorEdit]
    notes: list[str] = field(default_factory=list)


def plan(model: GgufModel, recipe: Recipe) -> Plan:
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
        for piece in resolver.all(edit_sites):
            if piece.site.op == "project":  # a whole matrix changes: no block's scale can carry it
                raise RecipeError(
                    f"{model.path.name}: a direction edit rewrites whole matrices, which a GGUF block "
                    "cannot store exactly; import it (surgery import-gguf) and bake the checkpoint"
                )
            if piece.site.expert is not None or piece.window is not None:
                raise RecipeError(
                    f"{model.path.name}: edits of routed experts or grouped outputs are not supported "
                    "in GGUF files yet; import it (surgery import-gguf) and bake the checkpoint"
                )
            t = model.tensor(piece.tensor)
            check_supported(t.type, t.name)
            if len(t.shape) == 2 and t.shape != tuple(piece.shape):
                raise CheckpointError(
                    f"{model.path.name}: {t.name} has shape {list(t.shape)}, the config says "
                    f"{list(piece.shape)}; the file does not match its metadata"
                )
            if not piece.as_rows and silenced and piece.scale == 0.0 and not _zeroes_values(t.type):
                # The zero gate/up rows already silence the neuron (act(0)·0 = 0): the down column is not needed.
                kept[t.type] = kept.get(t.type, 0) + len(piece.lines)
                continue
            te = by_name.setdefault(t.name, TensorEdit(t))
            target = te.rows if piece.as_rows else te.cols
            for i in piece.lines:
                target[i] = target.get(i, 1.0) * piece.scale
            if piece.as_rows and not piece.is_bias:
                bias = model.header.tensors.get(t.name.removesuffix(".weight") + ".bias")
                if bias is not None:  # an output feature's bias entry goes with its row
                    check_supported(bias.type, bias.name)
                    be = by_name.setdefault(bias.name, TensorEdit(bias))
                    for i in piece.lines:
                        be.rows[i] = be.rows.get(i, 1.0) * piece.scale
    notes = [
        f"{n} down-projection column(s) stored as {kind} left as is: {kind} cannot zero a single value "
        "exactly; the pruned neurons' zero gate/up rows already silence them"
        for kind, n in sorted(kept.items())
    ]
    return Plan(sorted(by_name.values(), key=lambda e: e.tensor.offset), notes)


def _zeroes_values(kind: str) -> bool:
    return kind in FLOATS or kind in ELEMENT_ZERO


def read_units(fd: int, offsets: np.ndarray, nbytes: int) -> np.ndarray:
    """The bytes (U, nbytes) of the blocks at ``offsets`` (sorted), one read per contiguous run."""
    out = np.empty((len(offsets), nbytes), dtype=np.uint8)
    for a, b in runs(offsets, nbytes):
        want = (b - a) * nbytes
        data = os.pread(fd, want, int(offsets[a]))
        if len(data) != want:
            raise CheckpointError("the GGUF file ended inside an edited tensor; it is truncated: download it again")
        out[a:b] = np.frombuffer(data, dtype=np.uint8).reshape(b - a, nbytes)
    return out


def runs(offsets: np.ndarray, nbytes: int) -> list[tuple[int, int]]:
    """[start, end) index ranges of ``offsets`` whose blocks are adjacent in the file."""
    if not len(offsets):
        return []
    breaks = np.nonzero(np.diff(offsets) != nbytes)[0] + 1
    edges = [0, *breaks.tolist(), len(offsets)]
    return list(zip(edges[:-1], edges[1:]))


@dataclass
class EditedTensor:
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


def edit_tensor(fd: int, te: TensorEdit, requantize: bool, original: np.ndarray | None = None) -> EditedTensor:
    """Read ``te``'s blocks from ``fd`` (or take ``original``) and compute their new bytes."""
    offsets, rows, blocks = te.units()
    _, nbytes = block_shape(te.tensor.type)
    old = read_units(fd, offsets, nbytes) if original is None else original
    return EditedTensor(
        te, offsets, old, edit_blocks(old, te.factors(rows, blocks), te.tensor.type, te.tensor.name, requantize)
    )
