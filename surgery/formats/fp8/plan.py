"""Edits on FP8 (e4m3) checkpoints: exact where exactness exists, refused in one line elsewhere.

An edit scales lines (rows or columns) of a weight's values, each value an e4m3 byte times its
scale (storage.py). Which bytes change:

* a line scaled by 0 (a pruned neuron): its e4m3 bytes become 0 (+0.0), exact in every layout;
* lines scaled by α that cover whole scale groups (a head's o_proj columns that are whole blocks,
  a row of a per-channel weight): the scales of those groups are multiplied by α instead, when
  α·s is exact in the scale's dtype;
* any other line: its e4m3 bytes are multiplied by α when α is a power of two and every product
  is an e4m3 value (no overflow past 448, no subnormal bits lost).

Whatever the route, the plan decodes the result before anything is written: the new dequantized
values must equal the recipe's scales times the source's dequantized values exactly in float32,
or the edit is refused naming the tensor, its layout and why. The bake's check and ``surgery
verify`` compare the same values from the written files (no FP8 model runs on a CPU).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ...core import e4m3
from ...core.architectures import Architecture
from ...core.checkpoint import Checkpoint, TensorInfo
from ...core.edits import Edit, Recipe
from ...core.errors import CheckpointError, RecipeError
from ...core.patches import CHUNK_BYTES, TensorPatch, patch_plan
from ...core.raw_values import from_f32, read_raw, to_f32
from ..plain import plain_problems
from .storage import ScaleLayout, dequantize, layout

SCALE_DTYPES = ("F32", "BF16", "F16")


def scale_of(ckpt: Checkpoint, info: TensorInfo) -> tuple[TensorInfo, ScaleLayout]:
    """The scale tensor of the FP8 weight ``info`` and its layout; one line when it is missing or does not fit."""
    scheme = ckpt.format.scheme
    name = scheme.scale_name(info.name)
    if name not in ckpt.tensors:
        raise CheckpointError(
            f"FP8 weight '{info.name}' has no scale tensor '{name}' ({scheme.method} layout); "
            "the checkpoint is incomplete: re-download it"
        )
    scale = ckpt.tensor(name)
    if scale.dtype not in SCALE_DTYPES:
        raise CheckpointError(
            f"scale tensor '{name}' is stored as {scale.dtype}; FP8 scales are F32, BF16 or F16: re-download the checkpoint"
        )
    return scale, layout(scheme, info.name, info.shape, name, scale.shape)


def check_fp8_scales(ckpt: Checkpoint) -> None:
    """Every e4m3 weight of an FP8 checkpoint has a scale tensor that fits it, and there is one (headers only)."""
    quantized = [info for info in ckpt.tensors.values() if info.dtype == e4m3.DTYPE]
    if not quantized:
        raise CheckpointError(
            f"{ckpt.path / 'config.json'} says the weights are FP8 (quantization_config: {ckpt.format.scheme.method}) "
            "but no tensor is stored as F8_E4M3: the config does not describe these weights; use the "
            "unquantized checkpoint with its own config, or re-download this one"
        )
    for info in quantized:
        scale_of(ckpt, info)


def read_scale(ckpt: Checkpoint, scale: TensorInfo) -> np.ndarray:
    """A whole scale tensor as float32 (scales are small: one per block or row)."""
    with open(ckpt.path / scale.file, "rb") as f:
        n_rows = scale.shape[0] if scale.shape else 1
        raw = read_raw(f.fileno(), scale, 0, n_rows, scale.shape[-1] if len(scale.shape) >= 2 else 1)
    return to_f32(raw, scale.dtype).reshape(scale.shape)


def _whole_groups(lines: dict[int, float], n: int, group: int) -> dict[int, float]:
    """Scale groups of ``group`` lines (of ``n``) whose every line is scaled by one α other than 0."""
    out = {}
    for g in range(math.ceil(n / group)):
        alphas = {lines.get(i) for i in range(g * group, min((g + 1) * group, n))}
        if len(alphas) == 1 and (a := alphas.pop()) not in (None, 0.0):
            out[g] = a
    return out


def _exact_product(values: np.ndarray, alpha: float, dtype: str) -> bool:
    """Whether every ``values`` × ``alpha`` is exact in ``dtype`` (float64 holds the product of two float32s)."""
    wide = values.astype(np.float64) * float(np.float32(alpha))
    return bool(np.array_equal(to_f32(from_f32(wide.astype(np.float32), dtype), dtype).astype(np.float64), wide))


def _scale_route(
    lines: dict[int, float], n: int, group: int, scale: np.ndarray, axis: int, dtype: str
) -> dict[int, float]:
    """The groups of ``lines`` taken by the scales (their lines removed from ``lines``): whole groups
    whose scales times α are exact in the scale's ``dtype``."""
    taken = {}
    for g, a in _whole_groups(lines, n, group).items():
        if _exact_product(np.take(scale.reshape(scale.shape[0], -1), g, axis=axis), a, dtype):
            taken[g] = a
            for i in range(g * group, min((g + 1) * group, n)):
                del lines[i]
    return taken


def _refusal(name: str, lay: ScaleLayout, alpha: float, why: str) -> RecipeError:
    # only block scales can carry a factor on columns: per-channel and per-tensor ones have no block to edit
    blocks = " edit whole scale blocks," if lay.kind == "block" else ""
    return RecipeError(
        f"cannot scale '{name}' ({lay.describe()} FP8 layout) by {alpha:g} exactly: {why}; choose a power "
        f"of two that keeps its weights in range,{blocks} or bake into the unquantized checkpoint"
    )


def _scaled_lines(
    raw: np.ndarray, start: int, rows: dict[int, float], cols: dict[int, float]
) -> tuple[np.ndarray, np.ndarray]:
    """(new e4m3 rows, float32 products) of rows [start, start + len(raw)) with ``rows`` and ``cols`` scaled
    element by element (cols first, as the byte plan does); an inexact product keeps an arbitrary byte.
    Only the scaled lines are encoded again: every other byte is the source's (each value but NaN has one
    code, and -0 keeps its sign bit)."""
    x = e4m3.decode(raw)
    new = raw.copy()
    if cols:
        idx = np.array(sorted(cols))
        x[:, idx] *= np.array([cols[c] for c in idx], dtype=np.float32)
        new[:, idx] = e4m3.encode_exact(x[:, idx])[0]
    here = np.array([r - start for r in rows if start <= r < start + len(raw)], dtype=np.int64)
    for r in here:
        x[r] *= np.float32(rows[start + int(r)])
    if len(here):
        new[here] = e4m3.encode_exact(x[here])[0]
    return new, x


def _reference(values: np.ndarray, start: int, p: TensorPatch) -> np.ndarray:
    """The recipe's values of a block of rows: the source's dequantized values times the line scales, in float32."""
    x = values.copy()
    if p.cols:
        idx = np.array(sorted(p.cols))
        x[:, idx] *= np.array([p.cols[c] for c in idx], dtype=np.float32)
    for r in (r for r in p.rows if start <= r < start + len(x)):
        x[r - start] *= np.float32(p.rows[r])
    return x


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a == b) | (np.isnan(a) & np.isnan(b))


def _row_steps(n_rows: int, n_cols: int) -> Iterable[tuple[int, int]]:
    step = max(1, CHUNK_BYTES // max(1, n_cols * 4))
    for start in range(0, n_rows, step):
        yield start, min(step, n_rows - start)


def _routed(ckpt: Checkpoint, p: TensorPatch) -> list[TensorPatch]:
    """``p`` (on an e4m3 weight's values) as exact patches of its bytes and of its scales, or a refusal."""
    name = p.info.name
    if p.project is not None:
        raise RecipeError(
            f"a direction edit rewrites every weight of '{name}', which FP8 (e4m3) cannot store exactly; "
            "bake it into the unquantized checkpoint"
        )
    if p.window is not None:
        raise CheckpointError(
            f"'{name}' holds several experts in one FP8 tensor; surgery edits FP8 weights stored one matrix per tensor"
        )
    scale, lay = scale_of(ckpt, p.info)
    s_src = read_scale(ckpt, scale)
    out_n, in_n = p.info.shape
    rows, cols = dict(p.rows), dict(p.cols)
    s_rows = s_cols = {}
    if lay.kind != "per-tensor":  # a per-tensor scale is the whole tensor's: no head or neuron owns it
        s_rows = _scale_route(rows, out_n, lay.rows, s_src, 0, scale.dtype)
    if lay.kind == "block":  # a per-channel scale belongs to a whole row
        s_cols = _scale_route(cols, in_n, lay.cols, s_src, 1, scale.dtype)
    for a in sorted({*rows.values(), *cols.values()} - {0.0}):
        if math.frexp(a)[0] not in (0.5, -0.5):
            why = "it is not a power of two" + (
                ""
                if lay.kind == "per-tensor"
                else ", and the edited lines are not whole scale groups whose scales times it are exact"
            )
            raise _refusal(name, lay, a, why)
    weight = TensorPatch(p.info, rows=rows, cols=cols)
    scales = TensorPatch(scale, rows=s_rows, cols=s_cols)
    s_new = s_src.copy()
    grid = s_new.reshape(s_new.shape[0], -1)
    for g, a in s_rows.items():
        grid[g] *= np.float32(a)
    for g, a in s_cols.items():
        grid[:, g] *= np.float32(a)
    with open(ckpt.path / p.info.file, "rb") as f:
        for start, n in _row_steps(out_n, in_n):
            raw = read_raw(f.fileno(), p.info, start, n, in_n)
            new, products = _scaled_lines(raw, start, rows, cols)
            bad = ~_same(e4m3.decode(new), products)
            if bad.any():
                r, c = (int(i[0]) for i in np.nonzero(bad))
                a = float(np.float32(rows.get(start + r, 1.0)) * np.float32(cols.get(c, 1.0)))
                big = abs(float(products[r, c])) > e4m3.MAX
                raise _refusal(
                    name,
                    lay,
                    a,
                    f"a weight would {'overflow e4m3 (past 448)' if big else 'lose bits below e4m3 subnormals'}",
                )
            expected = _reference(dequantize(raw, s_src, lay, start), start, p)
            if not _same(dequantize(new, s_new, lay, start), expected).all():
                a = next(iter({*p.rows.values(), *p.cols.values()} - {0.0}), 1.0)
                raise _refusal(name, lay, a, "the dequantized weights would not be the scaled ones in float32")
    return [q for q in (weight, scales) if q.rows or q.cols]


def stored_plan(ckpt: Checkpoint, arch: Architecture, edits: Iterable[Edit]) -> list[TensorPatch]:
    """The byte patches of ``edits``: :func:`~surgery.core.patches.patch_plan`'s, with every patch of an
    e4m3 weight turned into exact patches of its bytes and scales (or refused in one line)."""
    patches = patch_plan(ckpt, arch, edits)
    check_fp8_scales(ckpt)
    out = [q for p in patches for q in (_routed(ckpt, p) if p.info.dtype == e4m3.DTYPE else [p])]
    return sorted(out, key=lambda q: (q.info.name, q.first_row))


def dequantized_problems(src: Checkpoint, out: Checkpoint, recipe: Recipe) -> tuple[int, list[str]]:
    """(tensors compared, problem lines): every edited e4m3 weight of ``out``, dequantized, must equal
    the recipe's scales times ``src``'s dequantized weight exactly in float32; every other edited
    tensor must hold the byte plan's values (those are plain floats)."""
    patches = patch_plan(src, recipe.validate(src.config), recipe.active())
    problems = []
    for p in patches:
        if p.info.dtype != e4m3.DTYPE:
            problems += plain_problems(src, out, p)
            continue
        (s_info, lay), o_scale = scale_of(src, p.info), out.tensor(src.format.scheme.scale_name(p.info.name))
        s_src, s_out = read_scale(src, s_info), read_scale(out, o_scale)
        out_info = out.tensor(p.info.name)
        with open(src.path / p.info.file, "rb") as f_src, open(out.path / out_info.file, "rb") as f_out:
            for start, n in _row_steps(*p.info.shape):
                raw_src = read_raw(f_src.fileno(), p.info, start, n, p.info.shape[1])
                raw_out = read_raw(f_out.fileno(), out_info, start, n, p.info.shape[1])
                expected = _reference(dequantize(raw_src, s_src, lay, start), start, p)
                if not _same(dequantize(raw_out, s_out, lay, start), expected).all():
                    problems.append(
                        f"{out.path.name}: the dequantized '{p.info.name}' is not the recipe's scales times the "
                        "source's exactly"
                    )
                    break
    return len(patches), problems
