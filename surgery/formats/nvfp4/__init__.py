"""NVFP4 weights as compressed-tensors stores them (``nvfp4-pack-quantized``): e2m1 codes with an e4m3 scale
per 16 input columns and a global scale. How the config names them (storage.py), how an edit becomes exact
code and scale patches or a refusal (plan.py), how a model loads them decoded or held (hold.py)."""

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


class Nvfp4(StoredFormat):
    """An NVFP4 compressed-tensors checkpoint (llm-compressor's NVFP4 / NVFP4A16)."""

    name = "nvfp4"
    offered = "an NVFP4 compressed-tensors"
    # the planner reads a weight at its logical shape (int_packed's view), its packed codes as U8 bytes
    edited_dtypes = frozenset({"PACKED", "U8"})
    guarded = False  # codes and scales are edited exactly or refused by the plan: nothing is rounded

    def __init__(self, s: Scheme):
        self.scheme = s

    @classmethod
    def detect(cls, qconfig: Any) -> Nvfp4 | None:
        from .storage import scheme

        s = scheme(qconfig)
        return cls(s) if s is not None else None

    @classmethod
    def refusal(cls, qconfig: Any) -> str | None:
        from .storage import refusal

        return refusal(qconfig)

    def describe(self) -> str:
        return self.scheme.describe()

    @property
    def check_reads(self) -> str:
        return "NVFP4 codes (by compressed-tensors)"

    def view(self, ckpt: Checkpoint) -> Any:
        from ..int_packed.plan import EditView
        from .plan import weights_of

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
        """Without its quantization, each NVFP4 weight then decoded by compressed-tensors (or, ``held``, its
        stored codes and scales decoded as each layer runs, or its e2m1 values scaled where transformers
        renames or converts the checkpoint's tensors as it loads them)."""
        from ...model.dequantized import quiet_load
        from .hold import fill_weights, load_arguments, load_packed

        if held and (model := load_packed(ckpt, config, self.layerwise_dtype(ckpt, config))) is not None:
            return model
        with quiet_load(True):
            model, info = from_pretrained(**load_arguments(config))
        fill_weights(model, ckpt, info["missing_keys"], held=held)
        return model

    @property
    def loads_dequantized(self) -> bool:
        return True
