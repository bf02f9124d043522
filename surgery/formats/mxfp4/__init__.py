"""MXFP4 experts as transformers stores gpt-oss (``quant_method: mxfp4``, ``X_blocks`` / ``X_scales``): e2m1
codes with an E8M0 scale per 32 inputs. How they are stored (storage.py), how an edit becomes exact code
and scale patches or a refusal (plan.py), how a model loads them, held as stored or dequantized by
transformers (hold.py)."""

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


class Mxfp4(StoredFormat):
    """A gpt-oss MXFP4 checkpoint (the release format of gpt-oss-20b / 120b)."""

    name = "mxfp4"
    offered = "a gpt-oss MXFP4"
    # the planner reads an experts tensor at its float layout (int_packed's view), its blocks and scales as U8
    edited_dtypes = frozenset({"PACKED", "U8"})
    guarded = False  # codes and scales are edited exactly or refused by the plan: nothing is rounded

    def __init__(self, s: Scheme):
        self.scheme = s

    @classmethod
    def detect(cls, qconfig: Any) -> Mxfp4 | None:
        from .storage import scheme

        s = scheme(qconfig)
        return cls(s) if s is not None else None

    def describe(self) -> str:
        return self.scheme.describe()

    @property
    def check_reads(self) -> str:
        return "MXFP4 codes (by transformers)"

    def view(self, ckpt: Checkpoint) -> Any:
        from .plan import MxView, weights_of

        return MxView(ckpt, weights_of(ckpt))

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
        """``held``: the experts as stored (blocks and scales), decoded as each layer runs; else, or where
        transformers would load the file under other names, dequantized by transformers into the load dtype
        (exact in any float: e2m1 times a power of two)."""
        from ...model.dequantized import quiet_load
        from .hold import load_arguments, load_packed

        if held and (model := load_packed(ckpt, config, self.layerwise_dtype(ckpt, config))) is not None:
            return model
        with quiet_load(False):
            return from_pretrained(**load_arguments())

    @property
    def loads_dequantized(self) -> bool:
        return True
