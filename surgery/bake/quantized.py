"""The stored plan, the exact check and the pre-load shape check, whatever the checkpoint stores: plain
floats, FP8 (surgery/bake/fp8.py) or int4 / int8 codes (surgery/bake/int_packed.py). A quantized
bake's check compares dequantized weights, exactly: the edit itself, with no model to run."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from ..core.architectures import Architecture
from ..core.checkpoint import Checkpoint
from ..core.edits import Edit, Recipe
from ..core.errors import SurgeryError
from . import fp8, int_packed
from .patches import TensorPatch, check_attention
from .record import Verification


def stored_plan(ckpt: Checkpoint, arch: Architecture, edits: Iterable[Edit]) -> list[TensorPatch]:
    """The byte patches of ``edits`` on ``ckpt``: on its floats, its FP8 bytes and scales, or its integer codes and scales."""
    if ckpt.int_scheme is not None:
        return int_packed.stored_plan(ckpt, arch, edits)
    return fp8.stored_plan(ckpt, arch, edits)


def dequantized_problems(src: Checkpoint, out: Checkpoint, recipe: Recipe) -> tuple[int, list[str]]:
    """(tensors compared, problem lines) of a bake of the quantized ``src`` into ``out``."""
    if src.int_scheme is not None:
        return int_packed.dequantized_problems(src, out, recipe)
    return fp8.dequantized_problems(src, out, recipe)


def quantized_check(ckpt: Checkpoint, recipe: Recipe) -> Callable[[Path], Verification]:
    """The bake's check on a quantized checkpoint: the dequantized edited weights, exactly (a bake hook)."""
    kind = (
        "e4m3 weights" if ckpt.fp8_scheme is not None else f"{ckpt.int_scheme.describe()} codes (by compressed-tensors)"
    )

    def check(staged: Path) -> Verification:
        maps, problems = dequantized_problems(ckpt, Checkpoint(staged, allow_remote_code=True), recipe)
        if problems:
            raise SurgeryError(f"{problems[0]}; nothing was written. Please report this bug")
        return Verification(
            kind="dequantized weights",
            maps=maps,
            max_abs_diff=0.0,
            reference=f"the source's {kind} times their scales, times the recipe's scales, float32, "
            "equal bit for bit to the output's; the rest of the output is a byte copy of the source",
            end_to_end="surgery verify compares the dequantized weights again (no quantized model runs on a CPU)",
        )

    return check


def check_loadable(ckpt: Checkpoint) -> None:
    """Before a find command loads the model: a config that does not describe the weights is one
    line naming the field and the tensor, not a size mismatch inside transformers' loader (an int4 /
    int8 checkpoint's packed weights are read at their logical shape)."""
    from ..core.architectures import architecture

    check_attention(int_packed.planner_view(ckpt), architecture(ckpt.config))
