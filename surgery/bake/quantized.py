"""The bake's check of a quantized checkpoint, whatever its format (surgery/formats/): it compares
dequantized weights, exactly, by the format's own decoder: the edit itself, with no model to run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..core.checkpoint import Checkpoint
from ..core.edits import Recipe
from ..core.errors import SurgeryError
from .record import Verification


def quantized_check(ckpt: Checkpoint, recipe: Recipe) -> Callable[[Path], Verification]:
    """The bake's check on a quantized checkpoint: the dequantized edited weights, exactly (a bake hook)."""
    kind = ckpt.format.check_reads

    def check(staged: Path) -> Verification:
        maps, problems = ckpt.format.check(ckpt, Checkpoint(staged, allow_remote_code=True), recipe)
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
