"""FP8 (e4m3) weights with float scales: how the config names them (storage.py), how an edit becomes exact
byte and scale patches or a refusal (plan.py), how a model loads them dequantized (hold.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ...core import e4m3
from ...core.stored_format import StoredFormat

if TYPE_CHECKING:
    from ...core.architectures import Architecture
    from ...core.checkpoint import Checkpoint
    from ...core.edits import Edit, Recipe
    from ...core.patches import TensorPatch
    from .storage import Scheme


class Fp8(StoredFormat):
    """An FP8 e4m3 checkpoint (``quant_method`` fp8, or compressed-tensors float-quantized)."""

    name = "fp8"
    offered = "an FP8 e4m3"
    edited_dtypes = frozenset({e4m3.DTYPE})

    def __init__(self, s: Scheme):
        self.scheme = s

    @classmethod
    def detect(cls, qconfig: Any) -> Fp8 | None:
        from .storage import scheme

        s = scheme(qconfig)
        return cls(s) if s is not None else None

    def describe(self) -> str:
        return "e4m3"

    def plan(self, ckpt: Checkpoint, arch: Architecture, edits: Iterable[Edit]) -> list[TensorPatch]:
        from .plan import stored_plan

        return stored_plan(ckpt, arch, edits)

    def check(self, src: Checkpoint, out: Checkpoint, recipe: Recipe) -> tuple[int, list[str]]:
        from .plan import dequantized_problems

        return dequantized_problems(src, out, recipe)

    def layerwise_dtype(self, ckpt: Checkpoint, config: Any) -> Any:
        from ...model.loading import model_class_of
        from .hold import layerwise_dtype

        return layerwise_dtype(ckpt, model_class_of(config))

    def load(self, ckpt: Checkpoint, config: Any, held: bool, from_pretrained: Callable[..., Any]) -> Any:
        """Dequantized by transformers where that is exact (whole blocks), else by surgery: every weight
        filled in float32 or, ``held``, its e4m3 values (its bytes where the model loads by name) scaled
        as each layer runs."""
        from ...model.dequantized import quiet_load
        from ...model.widening import STORED
        from .hold import attach_scales, fill_weights, load_arguments, load_bytes, whole_blocks

        if held:
            dtype = self.layerwise_dtype(ckpt, config)
            if (model := load_bytes(ckpt, config, dtype)) is not None:
                return model
            held = dtype in STORED  # a float32 rest holds only the bytes: else the weights are dequantized whole
        whole = whole_blocks(ckpt)
        with quiet_load(held or not whole):
            model = from_pretrained(**load_arguments(ckpt, config, held=held))
        if held:
            attach_scales(model, ckpt)
        elif not whole:
            fill_weights(model, ckpt)
        return model

    @property
    def loads_dequantized(self) -> bool:
        return True
