"""Edits on int4 / int8 compressed-tensors checkpoints: exact where exactness exists, refused in one line elsewhere.

An edit scales lines (rows or columns) of a weight's values, each value (code − zero point) × its
group's scale (storage.py). Which bytes change:

* a row scaled by α (0 included: a pruned neuron's gate/up rows) in the group and channel
  strategies: that row's scales × α, codes untouched — the row owns them, and α·s must be exact in
  the scale's dtype (0 always is). Zeroing the scales rather than the codes writes in/group values
  instead of the row's codes and is exact whether or not the weight has zero points;
* columns scaled by α that are whole scale groups (a head's o_proj columns when head_dim is a
  multiple of the group size and the heads are aligned; with GPTQ's actorder "group", when the groups
  its columns belong to by ``X.weight_g_idx`` hold those columns and no other): those groups' scales
  × α, when exact;
* any other line scaled by 0 (a pruned neuron's down column; a row of a per-tensor weight): its
  codes set to their zero point, which decodes to exactly 0;
* any other line scaled by α ≠ 0: refused in one line. A code times α leaves the int range for
  most weights, and a column is never its own scale group (channel strategy: one group per row).

Whatever the route, the plan decodes the result with compressed-tensors' own ``dequantize`` before
anything is written: the new values must equal the recipe's scales times the source's values
exactly in float32, or the edit is refused naming the tensor, its layout and why. The bake's
check and ``surgery verify`` compare the same values from the written files. Both decode only the
values an edit can change (:func:`_windows`: the edited rows, and every row of the edited columns'
scale groups or words, the other codes of those words included); the bytes outside them are copied
unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from ...core.architectures import Architecture
from ...core.checkpoint import Checkpoint, TensorInfo
from ...core.edits import Edit, Recipe
from ...core.errors import CheckpointError, RecipeError
from ...core.patches import TensorPatch, patch_plan
from ...core.raw_values import RAW_DTYPES, from_f32, read_raw, to_f32
from ..fp8.plan import _exact_product, _reference, read_scale
from ..plain import plain_problems
from . import LOGICAL
from . import storage as int_packed
from .storage import IntWeight, Scheme

ROWS_PER_BLOCK = 1024  # rows dequantized at once: bounded float32 memory for any width


class EditView:
    """A checkpoint as the planner sees it: every pack-quantized weight also under its plain name
    ``X.weight`` at its logical [out, in] shape (dtype ``LOGICAL``, never read as bytes)."""

    def __init__(self, ckpt: Checkpoint, weights: dict[str, IntWeight]):
        self.ckpt, self.path, self.config = ckpt, ckpt.path, ckpt.config
        self.format = ckpt.format
        virtual = {
            n: TensorInfo(n, w.codes.file, LOGICAL, w.shape, w.codes.start, w.codes.end)
            for n, w in weights.items()
            if n not in ckpt.tensors
        }
        self.tensors = {**ckpt.tensors, **virtual}

    def tensor(self, name: str) -> TensorInfo:
        return self.tensors[name] if name in self.tensors else self.ckpt.tensor(name)


def weights_of(ckpt: Checkpoint) -> dict[str, IntWeight]:
    """Every integer weight of ``ckpt`` (its tensors' shapes checked); one line when there is none."""
    s = ckpt.format.scheme
    found = s.weights(ckpt.path, ckpt.tensors)
    if not found:
        stored = s.stored_name("X.weight") + ("" if s.packed else " as I8")
        raise CheckpointError(
            f"{ckpt.path / 'config.json'} says the weights are {s.describe()} but no tensor is stored as {stored}: "
            "the config does not describe these weights; use the unquantized checkpoint with its own config, "
            "or re-download this one"
        )
    return found


def _refusal(w: IntWeight, s: Scheme, alpha: float, why: str) -> RecipeError:
    # only group scales can carry a factor on columns (a head's): channel and tensor scales span whole rows
    groups = " edit whole scale groups by a scale their scales hold exactly," if s.strategy == "group" else ""
    return RecipeError(
        f"cannot scale '{w.codes.name}' ({s.describe()} layout) by {alpha:g} exactly: {why}; prune (scale 0),"
        f"{groups} or bake into the unquantized checkpoint"
    )


def _whole_groups(w: IntWeight, cols: dict[int, float]) -> dict[int, float]:
    """Scale groups of ``w`` whose every column (in order, or by its g_idx) is scaled by one α other than 0."""
    out = {}
    for g, members in enumerate(w.members()):
        alphas = {cols.get(int(c)) for c in members}
        if len(alphas) == 1 and (a := alphas.pop()) not in (None, 0.0):
            out[g] = a
    return out


def _group_route(w: IntWeight, cols: dict[int, float], grid: np.ndarray) -> dict[int, float]:
    """The scale groups that take ``cols`` (their columns removed from ``cols``): whole groups whose
    scales times α are exact in the scale's dtype."""
    members, taken = w.members(), {}
    for g, a in _whole_groups(w, cols).items():
        if _exact_product(grid[:, g], a, w.scale.dtype):
            taken[g] = a
            for c in members[g]:
                del cols[int(c)]
    return taken


def _why(s: Scheme, w: IntWeight, row: bool, whole: bool) -> str:
    """Why lines scaled by α ≠ 0 are refused: their scales cannot take α exactly, or they own no scales."""
    if row or (whole and s.strategy == "group"):
        lines = "its rows" if row else "its columns"
        return f"{lines} are whole scale groups, but their scales times it are not exact in {w.scale.dtype}"
    spread = f" (actorder group: '{s.part(w.name, 'weight_g_idx')}' mixes them with other columns)"
    owner = {
        "group": "not whole scale groups" + (spread if s.permuted else ""),
        "channel": "not scale groups (channel strategy: one scale per row)",
        "tensor": "not whole scale groups (tensor strategy: one scale)",
    }[s.strategy]
    return f"its columns are {owner}, and surgery does not scale integer codes (most would leave the int{s.bits} range)"


def _codes(ckpt: Checkpoint, info: TensorInfo) -> np.ndarray:
    """A whole stored tensor of codes or zero points (int32 words or int8): a quarter to an eighth of the
    float weight it stands for."""
    rows, cols = (
        (info.shape[0], info.shape[-1])
        if len(info.shape) == 2
        else (1, max(1, info.nbytes // np.dtype(RAW_DTYPES[info.dtype]).itemsize))
    )
    with open(ckpt.path / info.file, "rb") as f:
        return read_raw(f.fileno(), info, 0, rows, cols).reshape(info.shape)


def _stored(ckpt: Checkpoint, s: Scheme, w: IntWeight, codes: np.ndarray | None = None):
    """(codes, float32 scales, int8 zero points or None) of ``w`` in compressed-tensors' layout: its codes
    as compressed-tensors stores them (I32 words [out, ⌈in·bits/32⌉] or I8 [out, in]), its scales in
    their stored shape ([out, groups], [out, 1] or [1]), its zero points [out, groups] (or [1]). ``codes``:
    stored codes to read instead of ``w``'s (an edit's, before it is written). AutoAWQ's tensors are
    converted by compressed-tensors' own converter (surgery/formats/awq/storage.py)."""
    raw = _codes(ckpt, w.codes) if codes is None else codes
    zero = None if w.zero is None else _codes(ckpt, w.zero)
    raw, scale, zero = s.compressed(raw, read_scale(ckpt, w.scale), zero)
    return raw, scale, None if zero is None else int_packed.zero_points(s, w, zero)


def _blocks(s: Scheme, w: IntWeight, codes: np.ndarray, scale: np.ndarray, zero) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, float32 values) of ``w`` a block of rows at a time, decoded by compressed-tensors."""
    out_n, in_n = w.shape
    for start in range(0, out_n, ROWS_PER_BLOCK):
        stop = min(out_n, start + ROWS_PER_BLOCK)
        rows = int_packed.unpack(s, codes[start:stop], in_n)
        per_row = s.strategy != "tensor"
        z = zero[start:stop] if zero is not None and per_row else zero
        yield start, int_packed.dequantize(s, rows, scale[start:stop] if per_row else scale, z, w.g_idx)


def _zero_targets(w: IntWeight, zero):
    """Each weight's zero point, int8 [out, in] (a torch tensor; 0 when symmetric): what a zeroed code becomes."""
    import torch

    out_n, in_n = w.shape
    if zero is None:
        return torch.zeros(out_n, in_n, dtype=torch.int8)
    group_of = torch.from_numpy(w.group_of())
    return (zero.reshape(1, 1).expand(out_n, 1) if zero.numel() == 1 else zero)[
        :, group_of.clamp(max=zero.shape[-1] - 1)
    ]


def _zeroed(s: Scheme, w: IntWeight, codes: np.ndarray, zero, rows: list[int], cols: list[int]) -> np.ndarray:
    """The stored codes with ``rows`` and ``cols`` set to their zero point (0 when symmetric): unpacked and
    packed again (by compressed-tensors, or in AWQ's words), so every other code keeps its bits. Only the
    rows and the words that hold ``cols`` are unpacked, where words are compressed-tensors' own (whole
    lines in AWQ's, whose converter turns the tensor around whole)."""
    out_n, in_n = w.shape
    target = _zero_targets(w, zero)
    if s.transposed:
        width = codes.shape[1] * 32 // s.bits if s.packed else in_n
        unpacked = int_packed.unpack(s, codes, width).clone()
        if rows:
            unpacked[rows, :in_n] = target[rows]
        if cols:
            unpacked[:, cols] = target[:, cols]
        return s.packed_codes(unpacked, in_n)
    per_word = 32 // s.bits if s.packed else 1
    new = codes.copy()
    if rows:
        line = int_packed.unpack(s, codes[rows], codes.shape[1] * per_word).clone()
        line[:, :in_n] = target[rows]
        new[rows] = s.packed_codes(line, in_n)
    if cols:
        words = sorted({c // per_word for c in cols})
        part = int_packed.unpack(s, _fresh(new[:, words]), len(words) * per_word).clone()
        at = {word: k * per_word for k, word in enumerate(words)}
        spots = [at[c // per_word] + c % per_word for c in cols]
        part[:, spots] = target[:, cols]
        new[:, words] = s.packed_codes(part, len(words) * per_word)
    return new


def _fresh(lines: np.ndarray) -> np.ndarray:
    """A C-ordered copy of picked ``lines``: numpy may leave a picked array's length-1 axis a stride that
    torch's views of its words as bytes (compressed-tensors' unpacking) refuse."""
    return np.array(lines, order="C", copy=True)


def _windows(s: Scheme, w: IntWeight, rows, cols) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """The (rows, columns) of ``w``'s values an edit of its ``rows`` and ``cols`` (output and input channels)
    can change, each a window decoded on its own: the edited rows whole, and every row of the edited
    columns' scale groups (group strategy) or words (their scale is their row's or the tensor's), which
    hold whole words. None where only the whole weight decodes as it is stored: AutoAWQ's words (converted
    whole), GPTQ's actorder "group" (scattered groups), or a last group or word cut short."""
    out_n, in_n = w.shape
    per_word = 32 // s.bits if s.packed else 1
    unit = w.group if s.strategy == "group" else per_word
    if s.transposed or s.permuted or unit % per_word or in_n % unit:
        return None
    found = []
    if rows:
        found.append((np.array(sorted(rows)), np.arange(in_n)))
    if cols:
        units = np.array(sorted({c // unit for c in cols}))
        found.append((np.arange(out_n), (units[:, None] * unit + np.arange(unit)).reshape(-1)))
    return found


def _window_values(s: Scheme, w: IntWeight, codes: np.ndarray, scale: np.ndarray, zero, window) -> np.ndarray:
    """float32 values of ``w`` at ``window`` (rows, columns: :func:`_windows`) from its stored ``codes``,
    float32 ``scale`` and int8 ``zero`` points (compressed-tensors' layout), by compressed-tensors: the words
    of those columns unpacked, and ``dequantize`` given their groups' scales and zero points, which computes
    each value as the whole weight's decode does."""
    import torch

    rows, cols = window
    per_word = 32 // s.bits if s.packed else 1
    words = cols[::per_word] // per_word  # whole words, in order
    part = int_packed.unpack(s, _fresh(codes[np.ix_(rows, words)]), len(cols))
    if s.strategy == "tensor":
        return int_packed.dequantize(s, part, scale, zero)
    picked = torch.from_numpy(rows)
    if s.strategy == "group":
        groups = cols[:: w.group] // w.group
        scale = scale[np.ix_(rows, groups)]
        zero = None if zero is None else zero[picked][:, torch.from_numpy(groups)]
    else:
        scale = scale[rows]
        zero = None if zero is None else zero[picked]
    return int_packed.dequantize(s, part, scale, zero)


def _window_reference(values: np.ndarray, window, p: TensorPatch) -> np.ndarray:
    """The recipe's values at ``window``: the source's there times the line scales of ``p``, in float32, in
    the order :func:`~..fp8.plan._reference` multiplies them."""
    rows, cols = window
    x = values.copy()
    edited = [k for k, c in enumerate(cols) if int(c) in p.cols]
    if edited:
        x[:, edited] *= np.array([p.cols[int(cols[k])] for k in edited], dtype=np.float32)
    for k, r in enumerate(rows):
        if int(r) in p.rows:
            x[k] *= np.float32(p.rows[int(r)])
    return x


def _scaled_exactly(s: Scheme, w: IntWeight, before: tuple, after: tuple, p: TensorPatch) -> bool:
    """Whether ``w`` decoded from ``after`` (codes, float32 scales, zero points) is its values decoded from
    ``before`` times ``p``'s line scales, exactly in float32 (where ``p`` can change them: :func:`_windows`)."""
    windows = _windows(s, w, p.rows, p.cols)
    if windows is None:
        pairs = zip(_blocks(s, w, *before), _blocks(s, w, *after))
        return all(np.array_equal(new, _reference(old, start, p)) for (start, old), (_, new) in pairs)
    for window in windows:
        old, new = (_window_values(s, w, *stored, window) for stored in (before, after))
        if not np.array_equal(new, _window_reference(old, window, p)):
            return False
    return True


def _lines(s: Scheme, rows, cols) -> tuple[list[int], list[int]]:
    """The stored tensor's (rows, columns) that hold the weight's ``rows`` and ``cols`` (output and input
    channels): the other way round where the storage is transposed (AutoAWQ's)."""
    return (sorted(cols), sorted(rows)) if s.transposed else (sorted(rows), sorted(cols))


def _routed(ckpt: Checkpoint, s: Scheme, w: IntWeight, p: TensorPatch) -> list[TensorPatch]:
    """``p`` (on the values of integer weight ``w``) as exact patches of its scales and codes, or a refusal."""
    if p.project is not None:
        raise RecipeError(
            f"a direction edit rewrites every weight of '{w.codes.name}', which {s.describe()} codes cannot store "
            "exactly; bake it into the unquantized checkpoint"
        )
    stored = _codes(ckpt, w.codes)
    codes, s_src, zero = _stored(ckpt, s, w, stored)
    grid = s_src.reshape(s_src.shape[0] if s_src.ndim else 1, -1)
    rows, cols = dict(p.rows), dict(p.cols)
    s_rows: dict[int, float] = {}
    s_cols: dict[int, float] = {}
    if s.strategy != "tensor":  # a row owns its row of scales
        s_rows = {r: a for r, a in rows.items() if _exact_product(grid[r], a, w.scale.dtype)}
        rows = {r: a for r, a in rows.items() if r not in s_rows}
    if s.strategy == "group":
        s_cols = _group_route(w, cols, grid)
    for a in sorted({*rows.values(), *cols.values()} - {0.0}):
        raise _refusal(w, s, a, _why(s, w, a in rows.values(), bool(_whole_groups(w, cols))))
    scale_rows, scale_cols = (s_cols, s_rows) if s.transposed else (s_rows, s_cols)
    scales = TensorPatch(w.scale, rows=scale_rows, cols=scale_cols)
    s_new = grid.copy()
    for r, a in s_rows.items():
        s_new[r] *= np.float32(a)
    for g, a in s_cols.items():
        s_new[:, g] *= np.float32(a)
    s_new = to_f32(from_f32(s_new, w.scale.dtype), w.scale.dtype)  # as the scale patch stores it
    new_stored = _zeroed(s, w, codes, zero, sorted(rows), sorted(cols)) if rows or cols else stored
    # the stored lines that hold the zeroed rows and columns: a packed line's whole words
    per_word = 32 // s.bits if s.packed else 1
    stored_rows, stored_cols = _lines(s, rows, cols)
    words = sorted({c // per_word for c in stored_cols})
    weight = TensorPatch(
        w.codes,
        rows=dict.fromkeys(stored_rows, 0.0),
        cols=dict.fromkeys(words, 0.0),
        replace={
            **{(True, r): new_stored[r] for r in stored_rows},
            **{(False, c): new_stored[:, c].copy() for c in words},
        },
    )
    # what the new stored codes decode to (AutoAWQ's: through compressed-tensors' converter again)
    new_codes = _stored(ckpt, s, w, new_stored)[0]
    before, after = (codes, grid.reshape(s_src.shape), zero), (new_codes, s_new.reshape(s_src.shape), zero)
    if not _scaled_exactly(s, w, before, after, p):
        a = next(iter({*p.rows.values(), *p.cols.values()} - {0.0}), 0.0)
        raise _refusal(w, s, a, "the dequantized weights would not be the scaled ones in float32")
    return [q for q in (weight, scales) if q.rows or q.cols]


def stored_plan(ckpt: Checkpoint, arch: Architecture, edits: Iterable[Edit]) -> list[TensorPatch]:
    """The byte patches of ``edits`` on an int4 / int8 checkpoint: the plan on the weights' values,
    every patch of an integer weight turned into exact patches of its scales and codes (or refused)."""
    s, weights = ckpt.format.scheme, weights_of(ckpt)
    patches = patch_plan(EditView(ckpt, weights), arch, edits)
    out = [q for p in patches for q in (_routed(ckpt, s, weights[p.info.name], p) if p.info.name in weights else [p])]
    return sorted(out, key=lambda q: (q.info.name, q.first_row))


def _values(ckpt: Checkpoint, s: Scheme, w: IntWeight) -> Iterator[tuple[int, np.ndarray]]:
    return _blocks(s, w, *_stored(ckpt, s, w))


def weight_values(ckpt: Checkpoint, w: IntWeight) -> np.ndarray:
    """The float32 values [out, in] of the integer weight ``w`` of ``ckpt``, decoded by compressed-tensors
    as every edit is checked (AutoAWQ's through its converter; GPTQ's actorder "group" by ``g_idx``)."""
    return np.concatenate([block for _, block in _values(ckpt, ckpt.format.scheme, w)])


def weight_factors(ckpt: Checkpoint, w: IntWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The two factors of :func:`weight_values`: (``units``, code − zero point [out, in], decoded by
    compressed-tensors with unit scales: small integers, exact in any float; ``scales``, float32 [out or 1,
    groups]; ``group_of``, each input column's group). compressed-tensors' float32 decode computes
    ``scales[:, group_of] * units``, so that product is :func:`weight_values`, bit for bit."""
    s = ckpt.format.scheme
    codes, scale, zero = _stored(ckpt, s, w)
    units = np.concatenate([block for _, block in _blocks(s, w, codes, np.ones_like(scale), zero)])
    return units, scale.reshape(scale.shape[0] if scale.ndim > 1 else 1, -1), w.group_of()


def dequantized_problems(src: Checkpoint, out: Checkpoint, recipe: Recipe) -> tuple[int, list[str]]:
    """(tensors compared, problem lines): every edited integer weight of ``out``, decoded by
    compressed-tensors where the edit can change it, must equal the recipe's scales times ``src``'s decoded
    weight exactly in float32; every other edited tensor must hold the byte plan's values (plain floats)."""
    s, weights = src.format.scheme, weights_of(src)
    patches = patch_plan(EditView(src, weights), recipe.validate(src.config), recipe.active())
    out_weights = s.weights(out.path, out.tensors)
    problems = []
    for p in patches:
        if p.info.name not in weights:
            problems += plain_problems(src, out, p)
            continue
        w, w_out = weights[p.info.name], out_weights.get(p.info.name)
        if w_out is None or w_out.shape != w.shape:
            problems.append(f"{out.path.name}: '{w.codes.name}' is missing or has another shape than the source's")
            continue
        if not _scaled_exactly(s, w, _stored(src, s, w), _stored(out, s, w_out), p):
            problems.append(
                f"{out.path.name}: the dequantized '{p.info.name}' is not the recipe's scales times the source's exactly"
            )
    return len(patches), problems
