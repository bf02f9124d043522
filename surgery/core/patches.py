"""What an edit does to the bytes of one tensor, computed in bounded-size chunks.

A recipe becomes a list of ``TensorPatch``: for one stored tensor, which rows and which columns
(or, for a bias, which elements) are scaled by what, and whether a direction is projected out of
it. ``patched_chunks`` turns a patch into the new bytes of the tensor, a bounded block of rows at a
time, computing in fp32 and rounding to the stored dtype once. Bake writes those bytes; verify
recomputes and compares them; undo keeps the originals.

A projection W ← W − w·r(rᵀW) rewrites every element, so it takes two passes over the row blocks
when the residual stream runs along the rows (first a = rᵀW, accumulated in float64, then
W′ = W − (w·r)⊗a in float32, rounded once), one pass when it runs along the columns (each row
is projected on its own: the embedding table). Memory stays one block plus vectors of the tensor's
width, whatever its size. The same pass measures how much of the direction the rounding leaves,
‖rᵀW′‖ / ‖rᵀW‖, recorded per matrix in surgery.json.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from .architectures import Architecture
from .checkpoint import Checkpoint, TensorInfo
from .edits import Edit
from .errors import CheckpointError, RecipeError
from .raw_values import FLOAT_DTYPES, RAW_DTYPES, from_f32, read_raw, to_f32
from .resolve import Resolver, TensorSlice
from .sites import Site, all_sites, sites

CHUNK_BYTES = 16 << 20
# 2^64 ≈ 1.8e19 is the square root of float32's largest value. Norms square the activations
# (RMSNorm upcasts to float32 even in fp16/bf16 models), so a weight that large writes values into
# the residual stream whose squares overflow: the model computes inf and NaN, though every stored
# weight is finite and the baked bytes match the run-time edit (surgery.bake.guards refuses scales
# that get there; a projection refuses it as it computes).
HUGE = 2.0**64


def _scaled(raw: np.ndarray, scale: float, dtype: str) -> np.ndarray:
    """``raw`` × ``scale`` in the stored dtype; an exact 0 writes +0.0 (a pruned weight is zero)."""
    if scale == 0.0:
        return np.zeros_like(raw)
    return from_f32(to_f32(raw, dtype) * np.float32(scale), dtype)


@dataclass(frozen=True)
class Projection:
    """W ← W − weight·r(rᵀW), r the float32 unit vector ``unit``; ``along_rows``: the residual stream
    runs along the rows of the tensor's 2-D view (an output projection), else along its columns
    (the [vocab, hidden] embedding table, a transposed expert window, an expert's bias row).
    ``op`` "add" (a steer edit's bias): b ← b + weight·r instead."""

    unit: bytes
    weight: float
    along_rows: bool
    op: str = "project"

    @property
    def r(self) -> np.ndarray:
        return np.frombuffer(self.unit, dtype=np.float32)


@dataclass
class TensorPatch:
    """Scales for the rows and columns of one stored tensor (elements, for a 1-D bias).

    A tensor of 3 or more dimensions is viewed as 2-D ([all leading dims, last dim]); ``first_row``
    and ``window`` then restrict the patch to one expert's block of rows of that view (``rows`` are
    relative to it, ``cols`` apply within it only), so several experts of one fused tensor are
    separate patches over disjoint byte ranges. ``project``: a direction projected out of the
    whole tensor (window), after the scales (they act on the other side of the matrix: the two
    commute).
    """

    info: TensorInfo
    rows: dict[int, float] = field(default_factory=dict)
    cols: dict[int, float] = field(default_factory=dict)
    first_row: int = 0
    window: int | None = None
    project: Projection | None = None
    # Stored elements that replace a line (``(True, row)`` or ``(False, column)``, over all of
    # ``n_rows``) instead of scaling it: integer codes set to their zero point, whose words also
    # hold other columns' codes (surgery/formats/int_packed/plan.py computes them).
    replace: dict[tuple[bool, int], np.ndarray] = field(default_factory=dict)

    @property
    def n_rows(self) -> int:
        if self.window is not None:
            return self.window
        return int(np.prod(self.info.shape[:-1])) if len(self.info.shape) >= 2 else self.info.shape[0]

    @property
    def n_cols(self) -> int:
        return self.info.shape[-1] if len(self.info.shape) >= 2 else 1


def _tensor(ckpt: Checkpoint, name: str, shape: tuple[int, ...], why: str | None = None) -> TensorInfo:
    """The header entry of ``name``, which must be a float tensor of ``shape`` (``why``: the config
    fields that set that shape, named in the error)."""
    info = ckpt.tensor(name)
    if info.dtype not in FLOAT_DTYPES and info.dtype not in ckpt.format.edited_dtypes:
        raise CheckpointError(
            f"tensor '{name}' is stored as {info.dtype}; surgery edits F32, F16 and BF16 weights only (and "
            "F8_E4M3, int4, int8, NVFP4 or MXFP4 ones whose config.json gives their scales: quantization_config)"
        )
    if info.shape != shape:
        if why is None:
            raise CheckpointError(
                f"tensor '{name}' has shape {list(info.shape)}, expected {list(shape)} from "
                "config.json; the config does not describe these weights"
            )
        raise CheckpointError(
            f"tensor '{name}' has shape {list(info.shape)}, expected {list(shape)} from config.json ({why}); "
            f"the config does not describe these weights: correct those fields in "
            f"{ckpt.path / 'config.json'} or re-download the checkpoint"
        )
    return info


def check_attention(ckpt: Checkpoint, arch: Architecture) -> None:
    """Every attention layer's q/k/v/o (fused qkv, MLA's low-rank pairs) shape must match the config's heads.

    Read from the safetensors headers only. Edits touch o_proj alone, but the bake's verification
    loads the whole model from the config: a wrong num_key_value_heads would otherwise surface
    there as a size mismatch inside transformers (an "internal error"), after the copy.
    """
    resolver = Resolver(arch, ckpt.tensors)
    for layer in arch.head_layers():  # a hybrid model's other layers have no such attention
        for module, (shape, why) in arch.at(layer).attention_shapes().items():  # at its own sizes (Gemma 4)
            _tensor(ckpt, resolver.stored(layer, module), arch.stored_shape(module, shape), why)


def _probes(arch: Architecture, layer: int) -> list[Edit]:
    """One edit of each kind ``layer`` offers, on its last head or neuron (and first and last expert), and a
    direction through its other token mixer's output projection: together they resolve to every tensor
    an edit of that layer may touch, at its full shape."""
    from .edits import SHARED, DirectionEdit, HeadScale, NeuronScale

    e = arch.layer_edits(layer)
    probes: list[Edit] = [HeadScale(layer, e.heads - 1, 0.5)] if e.heads else []
    if e.neurons:
        probes.append(NeuronScale(layer, e.neurons - 1, 0.0))
    probes += [NeuronScale(layer, e.expert_width - 1, 0.0, x) for x in sorted({0, e.experts - 1}) if e.experts]
    if e.shared_width:
        probes.append(NeuronScale(layer, e.shared_width - 1, 0.0, SHARED))
    if "mixer" in arch.residual_writers(layer):  # the other residual writers are the matrices above
        probes.append(DirectionEdit(module="mixer", vector="", weight=1.0, layer=layer))
    return probes


def check_layers(ckpt: Checkpoint, arch: Architecture) -> None:
    """Every tensor an edit of any kind may touch, in every layer, is in the checkpoint with the shape
    config.json gives (attention inputs included): read from the headers alone, a config that
    contradicts its weights is one line naming the tensor and the shape it should have."""
    check_attention(ckpt, arch)
    resolver = Resolver(arch, ckpt.tensors)
    for layer in range(arch.geometry.num_layers):
        for edit in _probes(arch, layer):
            for sl in resolver.all(sites(arch, edit)):
                _tensor(ckpt, sl.tensor, sl.shape)


def patch_plan(ckpt: Checkpoint, arch: Architecture, edits: Iterable[Edit]) -> list[TensorPatch]:
    """The tensor patches that realise ``edits`` on ``ckpt`` (identity edits change nothing): on the
    values of the weights (an FP8 weight's are dequantized: surgery/formats/fp8/plan.py says which
    bytes change)."""
    check_attention(ckpt, arch)
    return list(patches_for(ckpt, Resolver(arch, ckpt.tensors).all(all_sites(arch, edits))).values())


def patches_for(ckpt: Checkpoint, slices: Iterable[TensorSlice]) -> dict[str, TensorPatch]:
    """One patch per slice key (a tensor, or one expert's window of a fused tensor), in key order,
    holding every line the slices scale; a later slice of the same line wins."""
    patches: dict[str, TensorPatch] = {}
    for sl in slices:
        if sl.key not in patches:
            patches[sl.key] = TensorPatch(_tensor(ckpt, sl.tensor, sl.shape), first_row=sl.first_row, window=sl.window)
        p = patches[sl.key]
        if sl.site.op != "scale":
            project = Projection(sl.site.unit().tobytes(), sl.scale, sl.as_rows, sl.site.op)
            if p.project is not None and p.project != project:
                raise RecipeError(
                    f"two direction or steer edits change '{sl.tensor}'; one direction per matrix: combine "
                    "them into one recipe entry or bake them one after the other"
                )
            p.project = project
        else:
            (p.rows if sl.as_rows else p.cols).update(dict.fromkeys(sl.lines, sl.scale))
    for p in patches.values():
        # Scales act on the input side, projections on the residual side; both on one side cannot
        # come from the built-in kinds, and their order would matter.
        if p.project is not None and (p.rows if p.project.along_rows else p.cols):
            raise RecipeError(
                f"'{p.info.name}' is both projected and scaled along its residual axis; "
                "bake these edits one after the other"
            )
    return {k: patches[k] for k in sorted(patches)}


def _row_blocks(p: TensorPatch) -> Iterator[tuple[int, int]]:
    """Row ranges to rewrite: every block when columns change or a direction is projected, else
    just the edited rows."""
    if p.cols or p.project is not None:
        itemsize = np.dtype(RAW_DTYPES[p.info.dtype]).itemsize
        step = max(1, CHUNK_BYTES // (p.n_cols * itemsize))
        for start in range(0, p.n_rows, step):
            yield start, min(step, p.n_rows - start)
    else:
        for row in sorted(p.rows):
            yield row, 1


def patched_chunks(
    fd: int, p: TensorPatch, stats: dict | None = None
) -> Iterator[tuple[int, memoryview, dict[str, np.ndarray]]]:
    """Yield (absolute offset, new bytes, original slices) for each rewritten block of ``p``.

    ``fd`` is the source file. The original slices are the raw elements of the edited rows and
    columns of the block (the whole block under ``"block"`` for a projection), which is what undo
    needs to restore the source byte for byte. A projection puts ‖rᵀW′‖ / ‖rᵀW‖ into ``stats``
    under ``"left"`` once the last block is out.
    """
    if p.project is not None:
        yield from _projected_chunks(fd, p, {} if stats is None else stats)
        return
    itemsize = np.dtype(RAW_DTYPES[p.info.dtype]).itemsize
    col_idx = np.array(sorted(p.cols), dtype=np.int64)
    col_scale = np.array([p.cols[c] for c in col_idx], dtype=np.float64)
    for start, n in _row_blocks(p):
        block = read_raw(fd, p.info, p.first_row + start, n, p.n_cols)
        originals: dict[str, np.ndarray] = {}
        rows_here = [r for r in sorted(p.rows) if start <= r < start + n]
        if rows_here:
            originals["rows"] = block[np.array(rows_here) - start].copy()
        if len(col_idx):
            originals["cols"] = block[:, col_idx].copy()
            for value in np.unique(col_scale):
                idx = np.array([c for c in col_idx[col_scale == value] if (False, c) not in p.replace], dtype=np.int64)
                block[:, idx] = _scaled(block[:, idx], float(value), p.info.dtype)
            for c in (c for c in col_idx if (False, c) in p.replace):
                block[:, c] = p.replace[(False, c)][start : start + n]
        for r in rows_here:
            new = p.replace.get((True, r))
            block[r - start] = _scaled(block[r - start], p.rows[r], p.info.dtype) if new is None else new
        # A byte view of the block, not a copy: the caller writes it out before the next block.
        yield (
            p.info.start + (p.first_row + start) * p.n_cols * itemsize,
            block.reshape(-1).view(np.uint8).data,
            originals,
        )


def _scaled_f32(p: TensorPatch, start: int, n: int, fd: int) -> tuple[np.ndarray, np.ndarray]:
    """(raw block, its float32 values with ``p``'s row and column scales applied) for rows
    [start, start + n) of ``p``."""
    raw = read_raw(fd, p.info, p.first_row + start, n, p.n_cols)
    x = to_f32(raw, p.info.dtype)
    if p.cols:
        idx = np.array(sorted(p.cols), dtype=np.int64)
        x[:, idx] *= np.array([p.cols[c] for c in idx], dtype=np.float32)
    for r in (r for r in p.rows if start <= r < start + n):
        x[r - start] *= np.float32(p.rows[r])
    return raw, x


def _rounded(p: TensorPatch, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(raw elements, their float32 values) of the new block ``x``, rounded once to the stored
    dtype; a column scaled by 0 stays +0.0 (projecting a zero column changes nothing)."""
    zero = [c for c, s in p.cols.items() if s == 0.0]
    if zero:
        x[:, zero] = 0.0
    raw = from_f32(x, p.info.dtype)
    back = to_f32(raw, p.info.dtype)
    kind = "steer" if p.project.op == "add" else "direction"
    if not np.isfinite(back).all():
        raise RecipeError(
            f"weight {p.project.weight:g} of the {kind} edit of '{p.info.name}' makes some of its "
            f"weights overflow {p.info.dtype} (or the tensor holds inf/NaN); choose a smaller weight"
        )
    if back.size and (peak := float(np.abs(back).max())) >= HUGE:
        raise RecipeError(
            f"weight {p.project.weight:g} of the {kind} edit of '{p.info.name}' makes some of its "
            f"weights {peak:.2g}, past 2^64 ≈ 1.8e19: the activations they write overflow float32 in "
            "the next norm, which squares them; choose a smaller weight"
        )
    return raw, back


def _added_chunks(fd: int, p: TensorPatch) -> Iterator[tuple[int, memoryview, dict[str, np.ndarray]]]:
    """The blocks of an added bias: b′ = b + c·r in float32, rounded once (no direction to measure)."""
    itemsize = np.dtype(RAW_DTYPES[p.info.dtype]).itemsize
    wr = np.float32(p.project.weight) * p.project.r
    for start, n in _row_blocks(p):
        raw, x = _scaled_f32(p, start, n, fd)
        new, _ = _rounded(p, x + (wr[start : start + n, None] if p.project.along_rows else wr[None, :]))
        yield (
            p.info.start + (p.first_row + start) * p.n_cols * itemsize,
            new.reshape(-1).view(np.uint8).data,
            {"block": raw},
        )


def _projected_chunks(fd: int, p: TensorPatch, stats: dict) -> Iterator[tuple[int, memoryview, dict[str, np.ndarray]]]:
    """The blocks of a projected patch: W′ = W − w·r(rᵀW) (scales applied first), rounded once."""
    if p.project.op == "add":
        stats["left"] = None
        yield from _added_chunks(fd, p)
        return
    itemsize = np.dtype(RAW_DTYPES[p.info.dtype]).itemsize
    pr, blocks = p.project, list(_row_blocks(p))
    r64, wr = pr.r.astype(np.float64), np.float32(pr.weight) * pr.r
    before = after = 0.0
    if pr.along_rows:  # rᵀW needs every row before any row can change: a first pass
        a = np.zeros(p.n_cols, dtype=np.float64)
        for start, n in blocks:
            a += r64[start : start + n] @ _scaled_f32(p, start, n, fd)[1].astype(np.float64)
        a32, left = a.astype(np.float32), np.zeros(p.n_cols, dtype=np.float64)
        for start, n in blocks:
            raw, x = _scaled_f32(p, start, n, fd)
            new, back = _rounded(p, x - np.outer(wr[start : start + n], a32))
            left += r64[start : start + n] @ back.astype(np.float64)
            yield (
                p.info.start + (p.first_row + start) * p.n_cols * itemsize,
                new.reshape(-1).view(np.uint8).data,
                {"block": raw},
            )
        before, after = float(a @ a), float(left @ left)
    else:  # each row is projected on its own: c = W r per row
        for start, n in blocks:
            raw, x = _scaled_f32(p, start, n, fd)
            c = x.astype(np.float64) @ r64
            new, back = _rounded(p, x - np.outer(np.float32(pr.weight) * c.astype(np.float32), pr.r))
            c_new = back.astype(np.float64) @ r64
            before, after = before + float(c @ c), after + float(c_new @ c_new)
            yield (
                p.info.start + (p.first_row + start) * p.n_cols * itemsize,
                new.reshape(-1).view(np.uint8).data,
                {"block": raw},
            )
    # None: the matrix had no component along r to remove (e.g. a zero bias)
    stats["left"] = float(np.sqrt(after / before)) if before > 0 else None


def _line_peaks(fd: int, p: TensorPatch) -> dict[tuple[bool, int], float]:
    """max |value| of every edited line of ``p`` — ``(True, row)`` or ``(False, column)`` — read a
    bounded block of rows at a time (a column's peak is over every row of ``p``'s window)."""
    col_idx = np.array(sorted(p.cols), dtype=np.int64)
    col_peak = np.zeros(len(col_idx), dtype=np.float32)
    peaks: dict[tuple[bool, int], float] = {}
    for start, n in _row_blocks(p):
        block = read_raw(fd, p.info, p.first_row + start, n, p.n_cols)
        if len(col_idx):
            col_peak = np.maximum(col_peak, np.abs(to_f32(block[:, col_idx], p.info.dtype)).max(axis=0))
        for r in (r for r in p.rows if start <= r < start + n):
            peaks[(True, r)] = float(np.abs(to_f32(block[r - start], p.info.dtype)).max())
    peaks.update({(False, int(c)): float(v) for c, v in zip(col_idx, col_peak)})
    return peaks


def site_peaks(ckpt: Checkpoint, arch: Architecture, edits: Iterable[Edit]) -> list[tuple[Edit, Site, float, str]]:
    """For each site that scales by neither 0 nor 1: the largest |weight| it scales (float32,
    exact) and the stored dtype. Each edited tensor is read once, a bounded block at a time.

    Rounding is monotone in |value|, so this one value and the site's scale decide what the bake's
    rounding does to every weight of the site (see surgery.bake.guards).
    """
    chosen = [
        (e, site) for e in edits for site in sites(arch, e) if site.op == "scale" and site.scale not in (0.0, 1.0)
    ]  # a projection scales nothing
    if not chosen:
        return []
    check_attention(ckpt, arch)  # a config that contradicts the weights: the line names its fields
    resolver = Resolver(arch, ckpt.tensors)
    patches = patches_for(ckpt, [sl for _, site in chosen for sl in resolver.slices(site)])
    peaks: dict[str, dict[tuple[bool, int], float]] = {}
    for key, p in patches.items():
        with open(ckpt.path / p.info.file, "rb") as f:
            peaks[key] = _line_peaks(f.fileno(), p)
    found = []
    for e, site in chosen:
        slices = resolver.slices(site)
        peak = max(peaks[sl.key][(sl.as_rows, i)] for sl in slices for i in sl.lines)
        found.append((e, site, peak, patches[slices[0].key].info.dtype))
    return found


def group_by_file(patches: Iterable[TensorPatch]) -> dict[str, list[TensorPatch]]:
    out: dict[str, list[TensorPatch]] = defaultdict(list)
    for p in patches:
        out[p.info.file].append(p)
    return dict(out)


def restored_chunks(
    fd: int, p: TensorPatch, cols: np.ndarray | None, rows: np.ndarray | None
) -> Iterator[tuple[int, bytes]]:
    """Yield (absolute offset, bytes) that put the original slices back into a baked tensor.

    ``fd`` is the baked file; ``cols`` / ``rows`` are the originals that ``patched_chunks``
    reported, concatenated over its blocks (same order, same shapes).
    """
    itemsize = np.dtype(RAW_DTYPES[p.info.dtype]).itemsize
    col_idx = np.array(sorted(p.cols), dtype=np.int64)
    row_list = sorted(p.rows)
    done_cols = done_rows = 0
    for start, n in _row_blocks(p):
        block = read_raw(fd, p.info, p.first_row + start, n, p.n_cols)
        if len(col_idx):
            block[:, col_idx] = cols[done_cols : done_cols + n]
            done_cols += n
        rows_here = [r for r in row_list if start <= r < start + n]
        for r in rows_here:
            block[r - start] = rows[done_rows]
            done_rows += 1
        yield p.info.start + (p.first_row + start) * p.n_cols * itemsize, block.tobytes()
