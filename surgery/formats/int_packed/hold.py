"""Load an int4 / int8 checkpoint that transformers cannot run, dequantized by surgery: finders, eval
and verify's logits then run on every integer layout surgery bakes, on a CPU as on a GPU.

transformers (with compressed-tensors) runs symmetric pack-quantized weights, decompressed; it does
not run asymmetric pack-quantized ones (their row-packed zero points' shape), int-quantized ones on
a CPU (kept compressed, its first matmul fails), GPTQ's actorder "group" (compressed-tensors 0.20
refuses the config) nor AutoAWQ's without gptqmodel (``Scheme.not_run`` says which, measured). Such
a checkpoint loads from its config without quantization, its integer weights absent, and each is
then set to its values as compressed-tensors decodes them, exact in float32: the decode the bake
checks every edit with (plan.py), one weight at a time. Every weight the model
missed must be one of them, or the load is refused in one line.

For float32 compute, a checkpoint whose other weights are stored in one 16-bit dtype (as llm-compressor
and AutoAWQ write them) is not decoded whole (4 bytes a weight), on any integer layout, transformers'
own included: each weight is held as its codes less their zero points, small integers exact in that
dtype, and multiplied by its scales only for its layer's call (model/upcast.py), as FP8 values are
(surgery/formats/fp8/hold.py). compressed-tensors' float32 decode is that product, so the results are the
whole decode's, bit for bit.
"""

from __future__ import annotations

from typing import Any

from ...core.checkpoint import Checkpoint
from ...core.errors import CheckpointError
from ...model.dequantized import Filler, attach_scalings, group_scaling, held_dtype, without_quantization
from .plan import weight_factors, weight_values, weights_of


def layerwise_dtype(ckpt: Checkpoint, model_class) -> Any:
    """The 16-bit torch dtype to hold ``ckpt``'s integer weights in (codes less zero points) for float32
    compute a layer at a time, or None to decode them whole: the dtype of every other float tensor."""
    return held_dtype(ckpt, model_class, {w.scale.name for w in weights_of(ckpt).values()})


def load_arguments(config) -> dict[str, Any]:
    """from_pretrained's arguments that load the model of ``config`` without its quantization (the integer
    weights are then missing: :func:`fill_weights` puts them in)."""
    return {"config": without_quantization(config), "output_loading_info": True}


def fill_weights(model, ckpt: Checkpoint, missing: list[str], held: bool = False) -> None:
    """Put the dequantized values of every integer weight of ``ckpt`` into ``model`` (loaded by
    :func:`load_arguments`) or, ``held`` (loaded in :func:`layerwise_dtype`), its codes less their zero
    points, multiplied by its scales as each layer runs; ``missing``: the parameters transformers found
    no tensor for, each of which must be filled."""
    import torch

    weights = weights_of(ckpt)
    stored = [*ckpt.tensors, *weights]
    what = f"{ckpt.format.scheme.describe()} weight"
    filler = Filler(model, ckpt.config, stored, what)
    scalings = {}
    for name, w in weights.items():
        if not held:
            filler.put(name, torch.from_numpy(weight_values(ckpt, w)))
            continue
        units, scale, group_of = weight_factors(ckpt, w)
        filler.put(name, torch.from_numpy(units))
        scalings[name] = group_scaling(scale, group_of)
    if held:
        attach_scalings(model, ckpt.config, stored, scalings, what)
    left = sorted(set(missing) - filler.filled)
    if left:
        raise CheckpointError(
            f"{ckpt.path} has no tensor for '{left[0]}'"
            + (f" (and {len(left) - 1} more)" if len(left) > 1 else "")
            + f", which the {type(model).__name__} needs and which is not one of its integer weights: "
            "the checkpoint is incomplete; re-download it"
        )
