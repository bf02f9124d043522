"""Load an NVFP4 checkpoint for computation, dequantized by surgery: finders, eval and verify's logits run
on it on a CPU as on a GPU (transformers runs NVFP4 only through compressed-tensors' kernels).

The model loads from its config without quantization, its NVFP4 weights absent, and each is then set to
its values as compressed-tensors decodes them, exact in float32: the decode the bake checks every edit
with (plan.py), one weight at a time. For float32 compute, a checkpoint whose other weights are stored
in one 16-bit dtype (as llm-compressor writes them) is not decoded whole (4 bytes a weight): each weight
is held as its e2m1 values (exact in any 16-bit float) and multiplied by its group scales only for its
layer's call (model/upcast.py), as integer codes are (surgery/formats/int_packed/hold.py);
compressed-tensors' float32 decode is that product, so the results are the whole decode's, bit for bit.

Where transformers loads every other tensor under its own name (model/by_name.py), the weights are held as
the file stores them, not as 16-bit values (4 bytes for every byte of codes): the model is built on the
meta device, each weight's packed codes (a byte per two weights) and its e4m3 scales and global scale go
into its module as they are, and each byte becomes its two e2m1 values, by a 256-entry table of
compressed-tensors' unpacking, times the same group scales, for its layer's call: the same float32 values,
bit for bit, with nothing allocated at the float size while loading. Elsewhere (a mixture of experts that
transformers fuses as it loads) the 16-bit hold above is kept. transformers' own compressed load
(``CompressedTensorsConfig(run_compressed=True)``) is not used: compressed-tensors 0.20 has no
``CompressedLinear`` (it raises "no longer supported") and decompresses each weight once, at the model's
dtype, keeping it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...core.checkpoint import Checkpoint
from ...model.by_name import finish, load_by_name, missing_refusal, read_tensor
from ...model.dequantized import (
    Filler,
    attach_scalings,
    group_scaling,
    held_dtype,
    hold_packed,
    without_quantization,
)
from ..int_packed.hold import load_arguments
from .plan import weight_factors, weight_values, weights_of
from .storage import GROUP, byte_values, decode_held

__all__ = ["fill_weights", "layerwise_dtype", "load_arguments", "load_packed"]

WHAT = "NVFP4 weight"


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
    filler = Filler(model, ckpt.config, stored, WHAT)
    scalings = {}
    for name, w in weights.items():
        if not held:
            filler.put(name, torch.from_numpy(weight_values(ckpt, w)))
            continue
        values, scales = weight_factors(ckpt, w)
        filler.put(name, values)
        scalings[name] = group_scaling(scales.numpy(), np.arange(w.shape[1]) // GROUP)
    if held:
        attach_scalings(model, ckpt.config, stored, scalings, WHAT)
    left = sorted(set(missing) - filler.filled)
    if left:
        raise missing_refusal(ckpt, model, left, WHAT)


def load_packed(ckpt: Checkpoint, config, dtype) -> Any:
    """``ckpt``'s model (transformers ``config``, without its quantization) in the 16-bit ``dtype``
    (:func:`layerwise_dtype`), each NVFP4 weight held as its stored codes and scales and decoded for its
    layer's call; None where transformers would not load the other tensors by their names (model/by_name.py)."""
    weights = weights_of(ckpt)
    byte_values()  # compressed-tensors' unpacking, imported and tabulated as the model loads, not at its first call
    stored = {n for w in weights.values() for n in (w.codes.name, w.scale.name, w.global_scale.name)}
    model = load_by_name(ckpt, without_quantization(config), dtype, stored, weights)
    if model is None:
        return None

    def decode(codes, stored):
        return decode_held(codes, stored["scale"], stored["global_scale"])

    for name, w in weights.items():
        parts = {"scale": read_tensor(ckpt.path, w.scale), "global_scale": read_tensor(ckpt.path, w.global_scale)}
        hold_packed(model, name, read_tensor(ckpt.path, w.codes), parts, decode)
    finish(model, ckpt, WHAT)
    return model
