"""Load an NVFP4 checkpoint for computation, dequantized by surgery: finders, eval and verify's logits run
on it on a CPU as on a GPU (transformers runs NVFP4 only through compressed-tensors' kernels).

The model loads from its config without quantization, its NVFP4 weights absent, and each is then set to
its values as compressed-tensors decodes them, exact in float32: the decode the bake checks every edit
with (plan.py), one weight at a time. For float32 compute, a checkpoint whose other weights are stored
in one 16-bit dtype (as llm-compressor writes them) is not decoded whole (4 bytes a weight): each weight
is held as its e2m1 values (exact in any 16-bit float) and multiplied by its group scales only for its
layer's call (model/upcast.py), as integer codes are (surgery/formats/int_packed/hold.py);
compressed-tensors' float32 decode is that product, so the results are the whole decode's, bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...core.checkpoint import Checkpoint
from ...core.errors import CheckpointError
from ...model.dequantized import Filler, attach_scalings, group_scaling, held_dtype
from ..int_packed.hold import load_arguments
from .plan import weight_factors, weight_values, weights_of
from .storage import GROUP

__all__ = ["fill_weights", "layerwise_dtype", "load_arguments"]


def layerwise_dtype(ckpt: Checkpoint, model_class) -> Any:
    """The 16-bit torch dtype to hold ``ckpt``'s NVFP4 weights in (their e2m1 values) for float32 compute a
    layer at a time, or None to decode them whole: the dtype of every other float tensor."""
    scales = {n for w in weights_of(ckpt).values() for n in (w.scale.name, w.global_scale.name)}
    return held_dtype(ckpt, model_class, scales)


def fill_weights(model, ckpt: Checkpoint, missing: list[str], held: bool = False) -> None:
    """Put the dequantized values of every NVFP4 weight of ``ckpt`` into ``model`` (loaded by
    :func:`load_arguments`) or, ``held`` (loaded in :func:`layerwise_dtype`), its e2m1 values, multiplied by
    its group scales as each layer runs; ``missing``: the parameters transformers found no tensor for,
    each of which must be filled."""
    import torch

    weights = weights_of(ckpt)
    stored = [*ckpt.tensors, *weights]
    filler = Filler(model, ckpt.config, stored, "NVFP4 weight")
    scalings = {}
    for name, w in weights.items():
        if not held:
            filler.put(name, torch.from_numpy(weight_values(ckpt, w)))
            continue
        values, scales = weight_factors(ckpt, w)
        filler.put(name, values)
        scalings[name] = group_scaling(scales.numpy(), np.arange(w.shape[1]) // GROUP)
    if held:
        attach_scalings(model, ckpt.config, stored, scalings, "NVFP4 weight")
    left = sorted(set(missing) - filler.filled)
    if left:
        raise CheckpointError(
            f"{ckpt.path} has no tensor for '{left[0]}'"
            + (f" (and {len(left) - 1} more)" if len(left) > 1 else "")
            + f", which the {type(model).__name__} needs and which is not one of its NVFP4 weights: "
            "the checkpoint is incomplete; re-download it"
        )
