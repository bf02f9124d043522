"""Load a gpt-oss MXFP4 checkpoint for computation, on a CPU as on a GPU.

For float32 compute of a checkpoint whose other tensors are in one 16-bit dtype (the release's bfloat16),
the experts are held as the file stores them: the model is built on the meta device (model/by_name.py),
every other tensor goes into its parameter as stored, and each fused experts parameter is its ``_blocks``
bytes (a byte per two weights) with its E8M0 ``_scales`` beside it, decoded for its layer's call
(model/upcast.py) by a table of transformers' own decoder (``convert_moe_packed_tensors``: the two values
of every byte at every E8M0 scale, 512 KB): its float32 values bit for bit, at the file's size. The
decode is per layer, not per expert: transformers' experts implementations read the whole 3-D parameter
(the default on a CPU, ``grouped_mm``, takes every expert's weights in one call).

Elsewhere (another compute dtype, a device map, a float32 tensor that 16 bits would round, or a model
transformers would load under other names) the experts are dequantized by transformers as it loads
(``Mxfp4Config(dequantize=True)``) straight into the load dtype: e2m1 times a power of two is exact in
bfloat16 as in float32.
"""

from __future__ import annotations

from typing import Any

from ...core.checkpoint import Checkpoint
from ...model.by_name import finish, load_by_name, read_tensor
from ...model.dequantized import held_dtype, hold_packed, without_quantization
from .plan import weights_of
from .storage import decode_held, pair_values

WHAT = "MXFP4 experts tensor"


def layerwise_dtype(ckpt: Checkpoint, model_class) -> Any:
    """The 16-bit torch dtype of every tensor but the MXFP4 blocks and scales (the experts are dequantized
    into it exactly), or None to load in the compute dtype."""
    stored = {n for w in weights_of(ckpt).values() for n in (w.codes.name, w.scale.name)}
    return held_dtype(ckpt, model_class, stored)


def load_arguments() -> dict[str, Any]:
    """from_pretrained's arguments that load the experts dequantized by transformers."""
    from transformers import Mxfp4Config

    return {"quantization_config": Mxfp4Config(dequantize=True)}


def load_packed(ckpt: Checkpoint, config, dtype) -> Any:
    """``ckpt``'s model (transformers ``config``, without its quantization) in the 16-bit ``dtype``
    (:func:`layerwise_dtype`), each MXFP4 experts tensor held as its stored blocks and scales and decoded
    for its layer's call; None where transformers would not load the other tensors by their names
    (model/by_name.py)."""
    weights = weights_of(ckpt)
    pair_values()  # transformers' decoder, imported and tabulated as the model loads, not at its first call
    stored = {n for w in weights.values() for n in (w.codes.name, w.scale.name)}
    model = load_by_name(ckpt, without_quantization(config), dtype, stored, weights)
    if model is None:
        return None

    def decode(blocks, parts):
        return decode_held(blocks, parts["scales"])

    for name, w in weights.items():
        scales = read_tensor(ckpt.path, w.scale)
        hold_packed(model, name, read_tensor(ckpt.path, w.codes), {"scales": scales}, decode)
    finish(model, ckpt, WHAT)
    return model
