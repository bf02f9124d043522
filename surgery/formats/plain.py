"""Plain floats (F32, F16, BF16): every edit is computed in float32 and rounded once to the stored dtype
(surgery/core/patches.py); the format of every checkpoint no other format recognises."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..core.stored_format import StoredFormat

if TYPE_CHECKING:
    from ..core.architectures import Architecture
    from ..core.checkpoint import Checkpoint
    from ..core.edits import Edit, Recipe
    from ..core.patches import TensorPatch


class PlainFloat(StoredFormat):
    """Weights stored as floats: edited in place, loaded by transformers as they are."""

    name = "plain"
    offered = "the unquantized (F32/F16/BF16)"
    quantized = False
    fallback = True

    @classmethod
    def detect(cls, qconfig: Any) -> None:
        """Never by a config: plain floats are what no other format recognises."""
        return None

    def describe(self) -> str:
        return "float"

    def plan(self, ckpt: Checkpoint, arch: Architecture, edits: Iterable[Edit]) -> list[TensorPatch]:
        from ..core.patches import patch_plan

        return patch_plan(ckpt, arch, edits)

    def check(self, src: Checkpoint, out: Checkpoint, recipe: Recipe) -> tuple[int, list[str]]:
        """Every edited tensor of ``out`` holds the byte plan's values, byte for byte."""
        patches = self.plan(src, recipe.validate(src.config), recipe.active())
        return len(patches), [line for p in patches for line in plain_problems(src, out, p)]

    def layerwise_dtype(self, ckpt: Checkpoint, config: Any) -> Any:
        """The one 16-bit dtype every tensor is stored in (upcast a layer per call), or None."""
        from ..model.upcast import stored_dtype

        return stored_dtype(ckpt.tensors)


def plain_problems(src: Checkpoint, out: Checkpoint, p: TensorPatch) -> list[str]:
    """The problem line of a plain (float) tensor of ``out`` that does not hold ``p``'s bytes, if any."""
    from ..core.patches import patched_chunks

    with open(src.path / p.info.file, "rb") as f_src, open(out.path / p.info.file, "rb") as f_out:
        for offset, data, _ in patched_chunks(f_src.fileno(), p):
            if bytes(data) != os.pread(f_out.fileno(), len(data), offset):
                return [f"{out.path.name}: '{p.info.name}' does not hold the recipe's values"]
    return []
