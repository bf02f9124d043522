"""The bake's own check: every edited linear map, baked against source + run-time twin.

Every byte of the output outside the edited slices is a copy of the source (kernel copies, and
the streamed shards take the source's block and overlay only the edited ranges; ``surgery verify``
re-checks each byte), so the edited slices alone decide whether the baked model computes the
run-time edit. Each site of surgery/core/sites.py is a set of columns (input features) or rows
(output features, with their bias entries) of one linear map: the check reads only those slices
from the source and the staged output (memory-mapped from the checked safetensors byte ranges; no
model and no torch, whose import alone costs more than copying a 1 GB model), runs both on random
inputs in float32, and compares the baked map with the source map with the site's scales applied — on
the input for a column site (exactly the run-time twin), on the output for a row site.

A routed expert's matrices are maps like any other (gate and up rows, down columns, GPT-OSS's
gate/up bias entries): the site resolution (surgery/core/resolve.py) says where each lies — a
tensor of its own, or the expert's window of a fused 3-D tensor, possibly stored [in, out] — and
which of its rows are a neuron's (fused gate/up: both halves, or interleaved). So a mixture-of-experts bake is checked from its slices too, without the model.

A projection (a direction edit, W ← W − w·r(rᵀW)) rewrites the whole matrix: its map is read
whole, a bounded block of rows at a time, and compared with the source map followed by the
projection of its output (exactly the run-time twin), its input scales (a head or neuron edit of
the same matrix) applied first; its bias, where it has one, against the projected source bias.
An addition (a steer edit) changes a bias alone: compared with the source bias plus c·r.

The two may differ only by the rounding of the scaled weights to the stored dtype (unit roundoff
``u``, half an ulp) and float32 summation, so each output element must lie within
``(u + 2·n·2⁻²⁴) · Σ|x·s|·|w|`` (n: terms summed) of the reference: a zeroed slice must be exactly
zero, and float32 weights agree to ~1e-7 relative. The end-to-end logit comparison is
``surgery verify``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.checkpoint import Checkpoint, TensorInfo
from ..core.edits import Recipe
from ..core.errors import SurgeryError
from ..core.patches import CHUNK_BYTES
from ..core.raw_values import RAW_DTYPES, to_f32
from ..core.resolve import Resolver
from ..core.sites import all_sites
from .record import Verification

INPUTS = 4  # random input vectors per map
SEED = 0
# Unit roundoff (half an ulp, relative) and half the smallest subnormal (absolute) of a stored dtype.
UNIT_ROUNDOFF = {"F32": 2.0**-24, "F16": 2.0**-11, "BF16": 2.0**-8}
HALF_TINY = {"F32": 2.0**-150, "F16": 2.0**-25, "BF16": 2.0**-134}
F32_EPS = 2.0**-24


@dataclass
class EditedMap:
    """The edited columns or rows of one weight matrix (and its bias), with their scales.

    A routed expert's matrix is its own tensor (one tensor per expert on disk), or the window
    ``expert`` of a fused 3-D tensor, stored [in, out] when ``flipped`` (its rows are then the
    window's columns).
    """

    weight: str
    bias: str | None
    axis: str  # "in": columns; "out": rows; "project": all of it; "add": a bias (``weight``) plus c·r
    scales: dict[int, float] = field(default_factory=dict)  # a projection's: its input scales
    expert: int | None = None
    flipped: bool = False
    rows: tuple[int, int] | None = None  # (first, count): a grouped linear's block (DeepSeek-V4's o_a_proj)
    project: tuple[bytes, float] | None = None  # a projection's unit vector (float32 bytes) and weight

    @property
    def label(self) -> str:
        """The weight's name, with the expert's window of a fused tensor or a group's block of rows."""
        if self.rows:
            return f"{self.weight}[rows {self.rows[0]}:{sum(self.rows)}]"
        return self.weight if self.expert is None else f"{self.weight}[expert {self.expert}]"


def edited_maps(ckpt: Checkpoint, recipe: Recipe) -> list[EditedMap]:
    """One entry per edited (weight, axis, expert window), from the site map and its resolution."""
    arch = recipe.validate(ckpt.config)
    resolver = Resolver(arch, ckpt.tensors)
    maps: dict[tuple[str, str, int, tuple[int, int]], EditedMap] = {}
    for site in all_sites(arch, recipe.active()):
        weight, *rest = resolver.slices(site)
        if site.op == "add":  # a steer edit: its one slice is the bias (an expert's row of a fused one)
            entry = EditedMap(
                weight.tensor,
                None,
                "add",
                expert=site.expert if weight.window is not None else None,
                project=(site.unit().tobytes(), site.scale),
            )
            maps[(entry.weight, entry.axis, -1 if entry.expert is None else entry.expert, (0, 0))] = entry
            continue
        bias = next((sl.tensor for sl in rest if sl.is_bias), None)
        expert = site.expert if weight.window is not None else None  # a window of a fused tensor
        if site.op == "project":  # the residual stream along the stored rows, else [in, out]
            entry = EditedMap(
                weight.tensor,
                bias,
                "project",
                expert=expert,
                flipped=not weight.as_rows,
                project=(site.unit().tobytes(), site.scale),
            )
            maps[(entry.weight, entry.axis, -1 if expert is None else expert, (0, 0))] = entry
            continue
        entry = EditedMap(
            weight.tensor,
            bias,
            site.axis,
            expert=expert,
            rows=site.rows,
            flipped=weight.as_rows != (site.axis == "out"),
        )  # stored [in, out]
        key = (entry.weight, entry.axis, -1 if expert is None else expert, site.rows or (0, 0))
        # a later edit wins, as in the plan; a fused gate/up window gathers both halves' rows
        maps.setdefault(key, entry).scales.update(dict.fromkeys(weight.lines, site.scale))
    for (weight, axis, expert, rows), m in list(maps.items()):  # a projected matrix's column scales: its inputs
        if axis == "project" and (weight, "in", expert, rows) in maps:
            m.scales = maps.pop((weight, "in", expert, rows)).scales
    return [maps[k] for k in sorted(maps)]


def _read(
    folder: Path,
    info: TensorInfo,
    axis: str,
    idx: list[int],
    expert: int | None = None,
    flipped: bool = False,
    rows: tuple[int, int] | None = None,
) -> np.ndarray:
    """float32 slices ``idx`` of a stored matrix (columns for "in", rows or elements for "out"),
    read through a memory map of its checked byte range: only the pages that hold them are touched.
    ``expert``: that window of a fused 3-D tensor; ``flipped``: stored [in, out]; ``rows``: that block."""
    stored = np.memmap(folder / info.file, dtype=RAW_DTYPES[info.dtype], mode="r", offset=info.start, shape=info.shape)
    matrix = stored if expert is None else stored[expert]
    matrix = matrix.T if flipped else matrix
    matrix = matrix[rows[0] : sum(rows)] if rows else matrix
    part = np.array(matrix[:, idx] if axis == "in" else matrix[idx])
    del stored, matrix
    return to_f32(part, info.dtype)


def _compare(
    baked: np.ndarray, reference: np.ndarray, magnitude: np.ndarray, dtype: str, terms: int
) -> tuple[float, float]:
    """(max |baked − reference|, max of that over its rounding bound) for one map's outputs."""
    bound = (UNIT_ROUNDOFF[dtype] + 2 * terms * F32_EPS) * magnitude.astype(np.float64) + HALF_TINY[dtype] * terms
    diff = np.abs(baked.astype(np.float64) - reference)
    with np.errstate(divide="ignore", invalid="ignore"):
        over = np.where(diff == 0, 0.0, diff / bound)  # an exact zero is fine, also where the bound is 0
    return float(diff.max(initial=0.0)), float(over.max(initial=0.0))


def _matrix(folder: Path, info: TensorInfo, expert: int | None) -> np.ndarray:
    """A memory map of a stored matrix (an expert's window of a fused tensor), as stored."""
    stored = np.memmap(folder / info.file, dtype=RAW_DTYPES[info.dtype], mode="r", offset=info.start, shape=info.shape)
    return stored if expert is None else stored[expert]


def check_projection(src: Checkpoint, out: Checkpoint, m: EditedMap, rng: np.random.Generator) -> tuple[float, float]:
    """(max |Δ|, max |Δ|/bound) of a projected map: baked W′x against P·(W·S)x, P = I − w·r·rᵀ.

    Read a bounded block of stored rows at a time; computed in float64, so the bound is the bake's
    float32 arithmetic and one rounding to the stored dtype, per element relative to
    |W·S| + |w·r|·|rᵀW·S| (what W′ is computed from).
    """
    unit, w = m.project
    r = np.frombuffer(unit, dtype=np.float32).astype(np.float64)
    info = src.tensor(m.weight)
    w_src, w_out = _matrix(src.path, info, m.expert), _matrix(out.path, out.tensor(m.weight), m.expert)
    along_rows = not m.flipped  # stored [out, in]: rows are output features
    n_in = w_src.shape[1] if along_rows else w_src.shape[0]
    s = np.ones(n_in)
    s[list(m.scales)] = [m.scales[i] for i in m.scales]
    x = rng.standard_normal((INPUTS, n_in), dtype=np.float32).astype(np.float64)
    xs = x * s
    H = len(r)
    y_src, y_out, mag = (np.zeros((INPUTS, H)) for _ in range(3))
    a = np.zeros(n_in)  # rᵀ·W·S
    step = max(1, CHUNK_BYTES // (w_src.shape[1] * 4))
    for start in range(0, w_src.shape[0], step):
        block = slice(start, start + step)
        ws, wo = (to_f32(np.array(mat[block]), info.dtype).astype(np.float64) for mat in (w_src, w_out))
        if along_rows:  # rows [block] of W: output features
            y_src[:, block], y_out[:, block], mag[:, block] = xs @ ws.T, x @ wo.T, np.abs(xs) @ np.abs(ws).T
            a += (r[block] @ ws) * s
        else:  # rows [block] of Wᵀ: input features
            y_src += xs[:, block] @ ws
            y_out += x[:, block] @ wo
            mag += np.abs(xs[:, block]) @ np.abs(ws)
            a[block] = (ws @ r) * s[block]
    ref = y_src - w * np.outer(y_src @ r, r)
    magnitude = mag + np.outer(np.abs(a * w) @ np.abs(x).T, np.abs(r))  # + |w·r_i|·Σ_j |a_j·x_j|
    results = [_compare(y_out, ref, magnitude, info.dtype, n_in)]
    if m.bias is not None:
        b_info = src.tensor(m.bias)
        b_src, b_out = (
            to_f32(np.array(_matrix(f.path, f.tensor(m.bias), m.expert)), b_info.dtype).astype(np.float64)
            for f in (src, out)
        )
        b_ref = b_src - w * (b_src @ r) * r
        # terms 4: the bake's float32 steps (rᵀb, w·r, the product, the difference) before the rounding
        results.append(_compare(b_out, b_ref, np.abs(b_src) + np.abs(w * (b_src @ r) * r), b_info.dtype, 4))
    return max(res[0] for res in results), max(res[1] for res in results)


def check_addition(src: Checkpoint, out: Checkpoint, m: EditedMap) -> tuple[float, float]:
    """(max |Δ|, max |Δ|/bound) of an added bias: baked b′ against b + c·r (float64; the bake's float32
    product and sum, then one rounding to the stored dtype)."""
    unit, c = m.project
    dtype = src.tensor(m.weight).dtype
    b_src, b_out = (
        to_f32(np.array(_matrix(f.path, f.tensor(m.weight), m.expert)), dtype).astype(np.float64).reshape(-1)
        for f in (src, out)
    )
    added = c * np.frombuffer(unit, dtype=np.float32).astype(np.float64)
    return _compare(b_out, b_src + added, np.abs(b_src) + np.abs(added), dtype, 2)


def check_map(src: Checkpoint, out: Checkpoint, m: EditedMap, rng: np.random.Generator) -> tuple[float, float]:
    """(max |Δ|, max |Δ|/bound) of one edited map's outputs on random inputs, baked vs reference."""
    if m.axis == "add":
        return check_addition(src, out, m)
    if m.project is not None:
        return check_projection(src, out, m, rng)
    idx = sorted(m.scales)
    s = np.array([m.scales[i] for i in idx], dtype=np.float32)
    info = src.tensor(m.weight)
    w_src, w_out = (_read(f.path, f.tensor(m.weight), m.axis, idx, m.expert, m.flipped, m.rows) for f in (src, out))
    if m.axis == "in":  # the twin: the input features scaled
        x = rng.standard_normal((INPUTS, len(idx)), dtype=np.float32)
        ref, baked = (x * s) @ w_src.T, x @ w_out.T
        results = [_compare(baked, ref, np.abs(x * s) @ np.abs(w_src).T, info.dtype, len(idx))]
    else:  # the output features scaled (a pruned neuron's gate/up rows)
        x = rng.standard_normal((INPUTS, w_src.shape[1]), dtype=np.float32)
        ref, baked = (x @ w_src.T) * s, x @ w_out.T
        results = [_compare(baked, ref, (np.abs(x) @ np.abs(w_src).T) * np.abs(s), info.dtype, w_src.shape[1])]
        if m.bias is not None:
            b_info = src.tensor(m.bias)
            b_src, b_out = (_read(f.path, f.tensor(m.bias), "out", idx, m.expert) for f in (src, out))
            results.append(_compare(b_out, b_src * s, np.abs(b_src * s), b_info.dtype, 1))
    return max(r[0] for r in results), max(r[1] for r in results)


def edited_check(ckpt: Checkpoint, recipe: Recipe) -> Callable[[Path], Verification]:
    """The check as a bake hook: runs on the staged output before it is published (on a quantized
    checkpoint: its dequantized weights, exactly, by its format's decoder: surgery/formats/)."""
    if ckpt.quantized:
        from .quantized import quantized_check

        return quantized_check(ckpt, recipe)

    def check(staged: Path) -> Verification:
        rng = np.random.default_rng(SEED)
        out = Checkpoint(staged, allow_remote_code=True)  # its own headers: offsets are checked again
        maps = edited_maps(ckpt, recipe)
        worst_diff = worst_ratio = 0.0
        for m in maps:
            diff, ratio = check_map(ckpt, out, m, rng)
            if not ratio <= 1.0:
                what = {
                    "in": "edited columns",
                    "out": "edited rows",
                    "project": "projected weights",
                    "add": "added bias entries",
                }[m.axis]
                raise SurgeryError(
                    f"the baked '{m.label}' does not compute the run-time edit (its "
                    f"{what} are off by {diff:.3g}, "
                    f"{ratio:.3g}× the rounding bound); nothing was written. Please report this bug"
                )
            worst_diff, worst_ratio = max(worst_diff, diff), max(worst_ratio, ratio)
        return Verification(
            kind="edited maps",
            maps=len(maps),
            inputs=INPUTS,
            max_abs_diff=worst_diff,
            max_diff_over_bound=worst_ratio,
            reference="source weights with the run-time twin (input scales, output projections) or "
            "the site's output scales, float32, on random inputs; the rest of the output "
            "is a byte copy of the source",
            end_to_end="surgery verify compares the logits",
        )

    return check
