"""Load an int4 / int8 checkpoint that transformers cannot run, dequantized by surgery: finders, eval
and verify's logits then run on every integer layout surgery bakes, on a CPU as on a GPU.

transformers (with compressed-tensors) runs symmetric pack-quantized weights, decompressed; it does
not run asymmetric pack-quantized ones (their row-packed zero points' shape), int-quantized ones on
a CPU (kept compressed, its first matmul fails), GPTQ's actorder "group" (compressed-tensors 0.20
refuses the config) nor AutoAWQ's without gptqmodel (``Scheme.not_run`` says which, measured). Such
a checkpoint loads from its config without quantization, its integer weights absent, and each is
then set to its values as compressed-tensors decodes them, exact in float32: the decode the bake
checks every edit with (surgery/bake/int_packed.py), one weight at a time. Every weight the model
missed must be one of them, or the load is refused in one line.
"""

from __future__ import annotations

from typing import Any

from ..core.checkpoint import Checkpoint
from ..core.errors import CheckpointError


def decodes_itself(ckpt: Checkpoint) -> bool:
    """Whether ``ckpt`` holds integer weights transformers cannot run, which surgery dequantizes itself."""
    return ckpt.int_scheme is not None and ckpt.int_scheme.not_run is not None


def load_arguments(config) -> dict[str, Any]:
    """from_pretrained's arguments that load the model of ``config`` without its quantization (the integer
    weights are then missing: :func:`fill_weights` puts them in)."""
    from .dequantized import without_quantization

    return {"config": without_quantization(config), "output_loading_info": True}


def fill_weights(model, ckpt: Checkpoint, missing: list[str]) -> None:
    """Put the dequantized values of every integer weight of ``ckpt`` into ``model`` (loaded by
    :func:`load_arguments`); ``missing``: the parameters transformers found no tensor for, each of which
    must be filled."""
    import torch

    from ..bake.int_packed import weight_values, weights_of
    from .dequantized import Filler

    weights = weights_of(ckpt)
    filler = Filler(model, ckpt.config, [*ckpt.tensors, *weights], f"{ckpt.int_scheme.describe()} weight")
    for name, w in weights.items():
        filler.put(name, torch.from_numpy(weight_values(ckpt, w)))
    left = sorted(set(missing) - filler.filled)
    if left:
        raise CheckpointError(
            f"{ckpt.path} has no tensor for '{left[0]}'"
            + (f" (and {len(left) - 1} more)" if len(left) > 1 else "")
            + f", which the {type(model).__name__} needs and which is not one of its integer weights: "
            "the checkpoint is incomplete; re-download it"
        )
