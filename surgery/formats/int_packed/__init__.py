"""Integer (int4 / int8) weights with scales and zero points, as compressed-tensors stores them (pack-quantized,
int-quantized, GPTQ's actorder): how the config names them (storage.py), how an edit becomes exact scale and
code patches or a refusal (plan.py), how a model loads them decoded or held (hold.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ...core.stored_format import StoredFormat

if TYPE_CHECKING:
    from ...core.architectures import Architecture
    from ...core.checkpoint import Checkpoint
    from ...core.edits import Edit, Recipe
    from ...core.patches import TensorPatch
    from .storage import Scheme

LOGICAL = "PACKED"  # dtype of the [out, in] entry a pack-quantized weight gets in the planner's view


class IntPacked(StoredFormat):
    """An int4 / int8 compressed-tensors checkpoint (llm-compressor's W4A16 / W8A16, GPTQ)."""

    name = "int_packed"
    offered = "an int4 / int8 compressed-tensors"
    # the planner reads a pack-quantized weight at its logical shape, an int-quantized one as its I8 codes
    edited_dtypes = frozenset({LOGICAL, "I8"})
    guarded = False  # codes and scales are edited exactly or refused by the plan: nothing is rounded

    def __init__(self, s: Scheme):
        self.scheme = s

    @classmethod
    def detect(cls, qconfig: Any) -> IntPacked | None:
        from .storage import scheme

        s = scheme(qconfig)
        return cls(s) if s is not None else None

    def describe(self) -> str:
        return self.scheme.describe()

    @property
    def check_reads(self) -> str:
        return f"{self.describe()} codes (by compressed-tensors)"

    def view(self, ckpt: Checkpoint) -> Any:
        from .plan import EditView, weights_of

        return EditView(ckpt, weights_of(ckpt))

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
        """By transformers (decompressed by compressed-tensors) where it runs these weights, else, and
        whenever ``held``, without their quantization, each weight then decoded (or held, as stored where
        transformers loads the other tensors by their names) by surgery."""
        from ...model.dequantized import quiet_load
        from ...model.widening import STORED
        from .hold import fill_weights, load_arguments, load_packed

        if held:
            dtype = self.layerwise_dtype(ckpt, config)
            if (model := load_packed(ckpt, config, dtype)) is not None:
                return model
            held = dtype in STORED  # a float32 rest holds only the stored codes: else they are decoded whole
        if not (held or self.loads_dequantized):
            return from_pretrained()
        with quiet_load(True):
            model, info = from_pretrained(**load_arguments(config))
        fill_weights(model, ckpt, info["missing_keys"], held=held)
        return model

    @property
    def loads_dequantized(self) -> bool:
        """Whether transformers cannot run these weights, so that surgery decodes them itself (exactly)."""
        return self.scheme.not_run is not None
