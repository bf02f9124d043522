"""Edits on gpt-oss MXFP4 experts: exact where exactness exists, refused in one line elsewhere.

The planner sees each fused experts tensor ``X`` at its float layout [experts, in, out] (a patch is one
expert's window of it: its rows are input channels, its columns output channels); the bytes are
``X_blocks`` [experts, out, in/32, 16] and ``X_scales`` [experts, out, in/32] (storage.py). Which bytes
change:

* a line scaled by 0 (a pruned neuron's gate/up outputs, its down input): its codes become +0 — each
  weight is its own code, so this is exact for an input column too, the other code of each byte
  keeping its bits;
* an output line, or whole blocks of 32 input lines, scaled by a power of two 2^k: their E8M0 scales
  + k, when they stay in 0..254;
* anything else (a part of a block, an α that is not a power of two, a direction): refused in one line
  naming the tensor.

The plan decodes the result with transformers' own MXFP4 decoder before anything is written: the new
values must equal the recipe's scales times the source's values exactly in float32. The bake's check
and ``surgery verify`` compare the same values from the written files. Both decode only the edited
blocks (the edited output lines' every block, every line's blocks that hold an edited input), each
byte by a table of that decoder's values over every (scale, byte) pair (storage.decoder_values): a
gpt-oss expert is 16.6 M weights, an edit a few thousand of them; every other byte of the expert must
equal the source's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ...core.architectures import Architecture
from ...core.checkpoint import Checkpoint
from ...core.edits import Edit, Recipe
from ...core.errors import CheckpointError, RecipeError
from ...core.patches import TensorPatch, patch_plan
from ...core.raw_values import read_raw
from ..int_packed.plan import EditView
from ..plain import plain_problems
from .storage import BLOCK, NAN, MxWeight, decode_blocks, mx_weights


class MxView(EditView):
    """The checkpoint as the planner sees it: each MXFP4 tensor under its plain name X at its float layout
    [experts, in, out], its blocks and scales hidden (the architecture table refuses experts it sees as
    ``_blocks``: this format is what edits them)."""

    def __init__(self, ckpt: Checkpoint, weights: dict[str, MxWeight]):
        super().__init__(ckpt, weights)
        hidden = {n for w in weights.values() for n in (w.codes.name, w.scale.name)}
        self.tensors = {n: info for n, info in self.tensors.items() if n not in hidden}


def weights_of(ckpt: Checkpoint) -> dict[str, MxWeight]:
    """Every MXFP4 tensor of ``ckpt`` (shapes checked); one line when there is none."""
    found = mx_weights(ckpt.tensors)
    if not found:
        raise CheckpointError(
            f"{ckpt.path / 'config.json'} says the weights are MXFP4 but no tensor is stored as X_blocks: the config "
            "does not describe these weights; use the unquantized checkpoint with its own config, or re-download this one"
        )
    return found


def _refusal(w: MxWeight, alpha: float, why: str) -> RecipeError:
    return RecipeError(
        f"cannot scale '{w.codes.name}' (MXFP4, E8M0 scales per {BLOCK} inputs) by {alpha:g} exactly: {why}; prune "
        "(scale 0), scale whole output lines or whole blocks of 32 inputs by a power of two, or bake into the "
        "unquantized checkpoint"
    )


def _expert(ckpt: Checkpoint, w: MxWeight, e: int) -> tuple[np.ndarray, np.ndarray]:
    """(blocks [out, in/32, 16], scales [out, in/32]) of expert ``e`` of ``w``."""
    _, inp, out = w.shape
    groups = inp // BLOCK
    with open(ckpt.path / w.codes.file, "rb") as f:
        blocks = read_raw(f.fileno(), w.codes, e * out * groups, out * groups, BLOCK // 2)
    with open(ckpt.path / w.scale.file, "rb") as f:
        scales = read_raw(f.fileno(), w.scale, e * out, out, groups)
    return blocks.reshape(out, groups, BLOCK // 2), scales


def _edited_mask(p: TensorPatch, shape: tuple[int, ...]) -> np.ndarray:
    """Which blocks ([out lines, input blocks]) of one expert a patch may change: every block of its
    edited output lines, every line's blocks holding an edited input."""
    edited = np.zeros(shape, dtype=bool)
    edited[sorted(p.cols)] = True
    edited[:, sorted({c // BLOCK for c in p.rows})] = True
    return edited


def _edited(p: TensorPatch, blocks: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, ...]:
    """The blocks of one expert a patch may change (:func:`_edited_mask`): (their bytes [n, 16], E8M0
    scales [n], output lines [n], input blocks [n])."""
    lines, groups = np.nonzero(_edited_mask(p, scales.shape))
    return blocks[lines, groups], scales[lines, groups], lines, groups


def _outside_same(p: TensorPatch, before: tuple[np.ndarray, np.ndarray], after: tuple[np.ndarray, np.ndarray]) -> bool:
    """Whether every block and scale of an expert outside the patch's edited blocks kept its bytes."""
    blocks = [np.ascontiguousarray(b).view(np.uint64) for b in (before[0], after[0])]  # a block's 16 bytes: 2 words
    changed = (before[1] != after[1]) | (blocks[0] != blocks[1]).any(axis=-1)
    return not (changed & ~_edited_mask(p, changed.shape)).any()


def _proven(p: TensorPatch, before: tuple[np.ndarray, np.ndarray], after: tuple[np.ndarray, np.ndarray]) -> bool:
    """Whether expert ``after`` (blocks, scales) is ``before`` with patch ``p``'s scales, exactly: its edited
    blocks decoded as transformers' decoder decodes them (storage.decode_blocks) equal the source's values
    times the recipe's scales in float32, and every other byte is the source's."""
    if not _outside_same(p, before, after):
        return False
    old, new = _edited(p, *before), _edited(p, *after)
    inputs = np.ones(before[1].shape[1] * BLOCK, dtype=np.float32)
    for c, a in p.rows.items():
        inputs[c] = a
    lines = np.array([p.cols.get(int(r), 1.0) for r in old[2]], dtype=np.float32)
    # the reference's order (fp8's _reference): the output line's scale, then the input's
    want = decode_blocks(*old[:2]) * lines[:, None] * inputs.reshape(-1, BLOCK)[old[3]]
    return np.array_equal(decode_blocks(*new[:2]), want)


def _inexact(w: MxWeight, p: TensorPatch) -> RecipeError:
    a = next(iter({*p.rows.values(), *p.cols.values()} - {0.0}), 0.0)
    return _refusal(w, a, "the dequantized weights would not be the scaled ones in float32")


def _power(alpha: float) -> int | None:
    """k where ``alpha`` is 2^k, else None."""
    m, k = math.frexp(alpha)
    return k - 1 if m == 0.5 else None


def _shifted(scales: np.ndarray, k: int) -> np.ndarray | None:
    """E8M0 ``scales`` + k, or None when one would leave 0..254."""
    new = scales.astype(np.int32) + k
    return new.astype(np.uint8) if ((new >= 0) & (new < NAN) & (scales != NAN)).all() else None


def _routed(ckpt: Checkpoint, w: MxWeight, p: TensorPatch) -> list[TensorPatch]:
    """``p`` (one expert's window of ``w``'s values) as exact patches of its blocks and scales, or a refusal."""
    if p.project is not None:
        raise RecipeError(
            f"a direction edit rewrites every weight of '{w.codes.name}', which MXFP4 codes cannot store exactly; "
            "bake it into the unquantized checkpoint"
        )
    experts, inp, out = w.shape
    if p.window != inp or p.first_row % inp:
        raise CheckpointError(f"an edit of '{w.name}' spans several experts; surgery edits MXFP4 experts one at a time")
    e, groups = p.first_row // inp, inp // BLOCK
    blocks, scales = _expert(ckpt, w, e)
    new_scales = scales.copy()
    outs, ins = dict(p.cols), dict(p.rows)  # the logical columns are stored rows, and the other way round
    for r, a in [(r, a) for r, a in outs.items() if a != 0.0]:
        k, shifted = _power(a), None
        if k is not None:
            shifted = _shifted(new_scales[r], k)
        if shifted is None:
            raise _refusal(w, a, "it is not a power of two that keeps the output line's scales in range")
        new_scales[r] = shifted
        del outs[r]
    for g in range(groups):
        alphas = {ins.get(c) for c in range(g * BLOCK, (g + 1) * BLOCK)}
        if len(alphas) == 1 and (a := alphas.pop()) not in (None, 0.0):
            k = _power(a)
            shifted = None if k is None else _shifted(new_scales[:, g], k)
            if shifted is None:
                raise _refusal(w, a, "it is not a power of two that keeps the block's scales in range")
            new_scales[:, g] = shifted
            for c in range(g * BLOCK, (g + 1) * BLOCK):
                del ins[c]
    for a in sorted({*ins.values()} - {0.0}):
        raise _refusal(w, a, f"its inputs are not whole blocks of {BLOCK}, and surgery does not scale e2m1 codes")
    new_blocks = blocks.copy()
    zero_rows, zero_ins = sorted(outs), sorted(ins)
    new_blocks[zero_rows] = 0  # +0 codes: both nibbles 0
    for c in zero_ins:  # the even input in the low nibble (transformers' order)
        new_blocks[:, c // BLOCK, (c % BLOCK) // 2] &= np.uint8(0xF0 if c % 2 == 0 else 0x0F)
    if not _proven(p, (blocks, scales), (new_blocks, new_scales)):
        raise _inexact(w, p)
    view = new_blocks.reshape(out * groups, BLOCK // 2)
    # the patches keep copies of their bytes, not views: a view would keep the whole expert's copy alive
    # (8 MB a gate_up expert of gpt-oss-20b, for each patch of the plan)
    byte_rows = sorted({r * groups + g for r in zero_rows for g in range(groups)})
    byte_cols = sorted({(c % BLOCK) // 2 for c in zero_ins})
    codes = TensorPatch(
        w.codes,
        rows=dict.fromkeys(byte_rows, 0.0),
        cols=dict.fromkeys(byte_cols, 0.0),
        first_row=e * out * groups,
        window=out * groups,
        replace={
            **dict(zip(((True, r) for r in byte_rows), view[byte_rows], strict=True)),
            **{(False, c): view[:, c].copy() for c in byte_cols},
        },
    )
    changed = sorted(int(r) for r in np.flatnonzero((new_scales != scales).any(axis=1)))
    scale = TensorPatch(
        w.scale,
        rows=dict.fromkeys(changed, 0.0),
        first_row=e * out,
        window=out,
        replace=dict(zip(((True, r) for r in changed), new_scales[changed], strict=True)),
    )
    return [q for q in (codes, scale) if q.rows or q.cols]


def stored_plan(ckpt: Checkpoint, arch: Architecture, edits: Iterable[Edit]) -> list[TensorPatch]:
    """The byte patches of ``edits`` on an MXFP4 checkpoint: the plan on the experts' values, every patch of
    an MXFP4 tensor turned into exact patches of its blocks and scales (or refused)."""
    weights = weights_of(ckpt)
    patches = patch_plan(MxView(ckpt, weights), arch, edits)
    out = [q for p in patches for q in (_routed(ckpt, weights[p.info.name], p) if p.info.name in weights else [p])]
    return sorted(out, key=lambda q: (q.info.name, q.first_row))


def dequantized_problems(src: Checkpoint, out: Checkpoint, recipe: Recipe) -> tuple[int, list[str]]:
    """(tensors compared, problem lines): every edited expert of ``out``, decoded by transformers, must equal
    the recipe's scales times ``src``'s exactly in float32; every other edited tensor the byte plan's values."""
    weights = weights_of(src)
    patches = patch_plan(MxView(src, weights), recipe.validate(src.config), recipe.active())
    out_weights = mx_weights(out.tensors)
    problems = []
    for p in patches:
        if p.info.name not in weights:
            problems += plain_problems(src, out, p)
            continue
        w, w_out = weights[p.info.name], out_weights.get(p.info.name)
        if w_out is None or w_out.shape != w.shape:
            problems.append(f"{out.path.name}: '{w.codes.name}' is missing or has another shape than the source's")
            continue
        e = p.first_row // w.shape[1]
        what = (
            f"{out.path.name}: the dequantized '{p.info.name}' (expert {e}) is not the recipe's scales times the "
            "source's exactly"
        )
        if not _proven(p, _expert(src, w, e), _expert(out, w_out, e)):
            problems.append(what)
    return len(patches), problems
