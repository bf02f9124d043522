"""Edits on NVFP4 checkpoints: exact where exactness exists, refused in one line elsewhere.

An edit scales lines (rows or columns) of a weight's values, each value its e2m1 value × (its group's
e4m3 scale / the global scale) (storage.py). Which bytes change:

* a line scaled by 0 (a pruned neuron's gate/up rows and its down column): its codes become +0 — each
  weight is its own code, so this is exact for a column too, and the other code of each byte keeps
  its bits;
* a row scaled by α ≠ 0: that row's e4m3 scales × α, codes untouched, when every product is an e4m3
  value (a power of two that keeps them in range always is);
* columns scaled by α ≠ 0 that are whole groups of 16 (a head's o_proj columns when head_dim is a
  multiple of 16): those groups' scales × α, when exact;
* anything else (a part of a group scaled by α ≠ 0, an α the scales cannot hold, a direction): refused
  in one line naming the tensor.

Whatever the route, the plan decodes the result with compressed-tensors' own ``dequantize`` before
anything is written: the new values must equal the recipe's scales times the source's values exactly
in float32, or the edit is refused. The bake's check and ``surgery verify`` compare the same values
from the written files.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from ...core import e4m3
from ...core.architectures import Architecture
from ...core.checkpoint import Checkpoint
from ...core.edits import Edit, Recipe
from ...core.errors import CheckpointError, RecipeError
from ...core.patches import TensorPatch, patch_plan
from ...core.raw_values import read_raw
from ..fp8.plan import read_scale
from ..int_packed.plan import EditView
from ..plain import plain_problems
from . import storage
from .storage import GROUP, Fp4Weight, Scheme

ROWS_PER_BLOCK = 1024  # rows decoded at once: bounded float32 memory for any width


def weights_of(ckpt: Checkpoint) -> dict[str, Fp4Weight]:
    """Every NVFP4 weight of ``ckpt`` (its tensors' shapes checked); one line when there is none."""
    found = storage.fp4_weights(ckpt.format.scheme, ckpt.tensors)
    if not found:
        raise CheckpointError(
            f"{ckpt.path / 'config.json'} says the weights are NVFP4 but no tensor is stored as X.weight_packed: "
            "the config does not describe these weights; use the unquantized checkpoint with its own config, "
            "or re-download this one"
        )
    return found


def _refusal(w: Fp4Weight, alpha: float, why: str) -> RecipeError:
    return RecipeError(
        f"cannot scale '{w.codes.name}' (NVFP4, e4m3 scales per {GROUP} columns) by {alpha:g} exactly: {why}; "
        "prune (scale 0), scale whole rows or whole groups of 16 columns by a power of two, or bake into the "
        "unquantized checkpoint"
    )


def _exact(scales: np.ndarray, alpha: float) -> bool:
    """Whether every e4m3 ``scales`` × ``alpha`` is an e4m3 value (float64 holds the exact product)."""
    wide = scales.astype(np.float64) * float(np.float32(alpha))
    raw, exact = e4m3.encode_exact(wide.astype(np.float32))
    return bool(exact.all() and np.array_equal(e4m3.decode(raw).astype(np.float64), wide))


def _read(ckpt: Checkpoint, info) -> np.ndarray:
    with open(ckpt.path / info.file, "rb") as f:
        rows = info.shape[0] if len(info.shape) == 2 else 1
        return read_raw(f.fileno(), info, 0, rows, info.shape[-1])


def _stored(ckpt: Checkpoint, w: Fp4Weight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(packed codes U8 [out, in/2], float32 e4m3 scales [out, in/16], float32 global scale [1]) of ``w``."""
    return _read(ckpt, w.codes), read_scale(ckpt, w.scale), read_scale(ckpt, w.global_scale).reshape(1)


def _blocks(s: Scheme, codes: np.ndarray, scale: np.ndarray, g: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, float32 values) of a weight a block of rows at a time, decoded by compressed-tensors."""
    for start in range(0, codes.shape[0], ROWS_PER_BLOCK):
        stop = min(codes.shape[0], start + ROWS_PER_BLOCK)
        yield start, storage.dequantize(s, storage.unpack(codes[start:stop]), scale[start:stop], g)


def _whole_groups(cols: dict[int, float], n_groups: int) -> dict[int, float]:
    """Groups of 16 columns whose every column is scaled by one α other than 0."""
    out = {}
    for g in range(n_groups):
        alphas = {cols.get(c) for c in range(g * GROUP, (g + 1) * GROUP)}
        if len(alphas) == 1 and (a := alphas.pop()) not in (None, 0.0):
            out[g] = a
    return out


def _zeroed(codes: np.ndarray, rows: list[int], cols: list[int]) -> np.ndarray:
    """The packed codes with ``rows`` and ``cols`` set to +0, unpacked and packed again by compressed-tensors
    (only the bytes that hold them), so the other code of each byte keeps its bits."""
    new = codes.copy()
    if rows:
        values = storage.unpack(codes[rows])
        values[:] = 0.0
        new[rows] = storage.pack(values)
    if cols:
        pairs = sorted({c // 2 for c in cols})
        values = storage.unpack(codes[:, pairs])  # column j is the weight's column 2·pairs[j // 2] + j % 2
        for c in cols:
            values[:, 2 * pairs.index(c // 2) + c % 2] = 0.0
        new[:, pairs] = storage.pack(values)
    return new


def _edited_parts(p: TensorPatch, grid: tuple[int, int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(rows, groups) of the weight that ``p`` edits, as whole groups of 16: its rows across every group,
    and every row across the groups of its columns. Every other value keeps its bytes and its scale."""
    parts = []
    if p.rows:
        parts.append((np.array(sorted(p.rows)), np.arange(grid[1])))
    if p.cols:
        parts.append((np.arange(grid[0]), np.array(sorted({c // GROUP for c in p.cols}))))
    return parts


def _decoded(s: Scheme, codes: np.ndarray, scale: np.ndarray, g: np.ndarray, part) -> np.ndarray:
    """float32 values of the ``part`` (rows, groups) of a weight, decoded by compressed-tensors."""
    rows, groups = part
    pairs = (groups[:, None] * (GROUP // 2) + np.arange(GROUP // 2)).reshape(-1)
    return storage.dequantize(s, storage.unpack(codes[np.ix_(rows, pairs)]), scale[np.ix_(rows, groups)], g)


def _expected(s: Scheme, codes: np.ndarray, scale: np.ndarray, g: np.ndarray, part, p: TensorPatch) -> np.ndarray:
    """The recipe's values of ``part``: the source's decoded values times ``p``'s line scales (columns first,
    as the byte plan applies them), in float32."""
    rows, groups = part
    x = _decoded(s, codes, scale, g, part)
    columns = (groups[:, None] * GROUP + np.arange(GROUP)).reshape(-1)
    for j, c in enumerate(columns):
        if int(c) in p.cols:
            x[:, j] *= np.float32(p.cols[int(c)])
    for i, r in enumerate(rows):
        if int(r) in p.rows:
            x[i] *= np.float32(p.rows[int(r)])
    return x


def _routed(ckpt: Checkpoint, s: Scheme, w: Fp4Weight, p: TensorPatch) -> list[TensorPatch]:
    """``p`` (on the values of NVFP4 weight ``w``) as exact patches of its codes and scales, or a refusal."""
    if p.project is not None:
        raise RecipeError(
            f"a direction edit rewrites every weight of '{w.codes.name}', which NVFP4 codes cannot store exactly; "
            "bake it into the unquantized checkpoint"
        )
    codes, scale, g = _stored(ckpt, w)
    rows, cols = dict(p.rows), dict(p.cols)
    s_rows = {r: a for r, a in rows.items() if a != 0.0 and _exact(scale[r], a)}
    s_cols = {k: a for k, a in _whole_groups(cols, scale.shape[1]).items() if _exact(scale[:, k], a)}
    for r in s_rows:
        del rows[r]
    for k in s_cols:
        for c in range(k * GROUP, (k + 1) * GROUP):
            del cols[c]
    for a in sorted({*rows.values(), *cols.values()} - {0.0}):
        if a in rows.values() or _whole_groups(cols, scale.shape[1]):
            lines = "its rows'" if a in rows.values() else "its column groups'"
            why = f"{lines} e4m3 scales times it are not e4m3 values (one would pass 448 or lose bits)"
        else:
            why = f"its columns are not whole groups of {GROUP}, and surgery does not scale e2m1 codes"
        raise _refusal(w, a, why)
    new_scale = scale.copy()
    for r, a in s_rows.items():
        new_scale[r] *= np.float32(a)
    for k, a in s_cols.items():
        new_scale[:, k] *= np.float32(a)
    zero_rows, zero_cols = sorted(rows), sorted(cols)
    new_codes = _zeroed(codes, zero_rows, zero_cols)
    pairs = sorted({c // 2 for c in zero_cols})  # the byte columns holding the zeroed codes
    weight = TensorPatch(
        w.codes,
        rows=dict.fromkeys(zero_rows, 0.0),
        cols=dict.fromkeys(pairs, 0.0),
        replace={
            **{(True, r): new_codes[r] for r in zero_rows},
            **{(False, c): new_codes[:, c].copy() for c in pairs},
        },
    )
    scales = TensorPatch(w.scale, rows=s_rows, cols=s_cols)
    for part in _edited_parts(p, scale.shape):
        if not np.array_equal(_decoded(s, new_codes, new_scale, g, part), _expected(s, codes, scale, g, part, p)):
            a = next(iter({*p.rows.values(), *p.cols.values()} - {0.0}), 0.0)
            raise _refusal(w, a, "the dequantized weights would not be the scaled ones in float32")
    return [q for q in (weight, scales) if q.rows or q.cols]


def stored_plan(ckpt: Checkpoint, arch: Architecture, edits: Iterable[Edit]) -> list[TensorPatch]:
    """The byte patches of ``edits`` on an NVFP4 checkpoint: the plan on the weights' values, every patch
    of an NVFP4 weight turned into exact patches of its codes and scales (or refused)."""
    s, weights = ckpt.format.scheme, weights_of(ckpt)
    patches = patch_plan(EditView(ckpt, weights), arch, edits)
    out = [q for p in patches for q in (_routed(ckpt, s, weights[p.info.name], p) if p.info.name in weights else [p])]
    return sorted(out, key=lambda q: (q.info.name, q.first_row))


def weight_values(ckpt: Checkpoint, w: Fp4Weight) -> np.ndarray:
    """The float32 values [out, in] of NVFP4 weight ``w`` of ``ckpt``, decoded by compressed-tensors."""
    return np.concatenate([block for _, block in _blocks(ckpt.format.scheme, *_stored(ckpt, w))])


def weight_factors(ckpt: Checkpoint, w: Fp4Weight):
    """The two factors of :func:`weight_values`: (e2m1 values [out, in] as float32 (exact in any 16-bit
    float), float32 group scales [out, in/16] (e4m3 scale / global scale)). compressed-tensors' float32
    decode is their product, bit for bit."""
    codes, scale, g = _stored(ckpt, w)
    return storage.unpack(codes), storage.group_scales(scale, g)


def dequantized_problems(src: Checkpoint, out: Checkpoint, recipe: Recipe) -> tuple[int, list[str]]:
    """(tensors compared, problem lines): every edited group of 16 of each NVFP4 weight of ``out``, decoded
    by compressed-tensors, must equal the recipe's scales times ``src``'s exactly in float32 (the rest of the
    bytes are compared by the structural check); every other edited
    tensor must hold the byte plan's values (plain floats)."""
    s, weights = src.format.scheme, weights_of(src)
    patches = patch_plan(EditView(src, weights), recipe.validate(src.config), recipe.active())
    out_weights = storage.fp4_weights(s, out.tensors)
    problems = []
    for p in patches:
        if p.info.name not in weights:
            problems += plain_problems(src, out, p)
            continue
        w, w_out = weights[p.info.name], out_weights.get(p.info.name)
        if w_out is None or w_out.shape != w.shape:
            problems.append(f"{out.path.name}: '{w.codes.name}' is missing or has another shape than the source's")
            continue
        source, written = _stored(src, w), _stored(out, w_out)
        for part in _edited_parts(p, source[1].shape):
            if not np.array_equal(_decoded(s, *written, part), _expected(s, *source, part, p)):
                problems.append(
                    f"{out.path.name}: the dequantized '{p.info.name}' is not the recipe's scales times the "
                    "source's exactly"
                )
                break
    return len(patches), problems
