"""Load a gpt-oss MXFP4 checkpoint for computation, dequantized by transformers (``Mxfp4Config(dequantize=True)``,
its ``convert_moe_packed_tensors``: the decoder the bake checks with), on a CPU as on a GPU.

Each value is an e2m1 value times a power of two, exact in bfloat16 as in float32, so the experts are
dequantized straight into the dtype the model is held in: for float32 compute, the checkpoint's other
16-bit dtype, each layer widened only for its call (model/upcast.py).
"""

from __future__ import annotations

from typing import Any

from ...core.checkpoint import Checkpoint
from ...model.dequantized import held_dtype
from .plan import weights_of


def layerwise_dtype(ckpt: Checkpoint, model_class) -> Any:
    """The 16-bit torch dtype of every tensor but the MXFP4 blocks and scales (the experts are dequantized
    into it exactly), or None to load in the compute dtype."""
    stored = {n for w in weights_of(ckpt).values() for n in (w.codes.name, w.scale.name)}
    return held_dtype(ckpt, model_class, stored)


def load_arguments() -> dict[str, Any]:
    """from_pretrained's arguments that load the experts dequantized by transformers."""
    from transformers import Mxfp4Config

    return {"quantization_config": Mxfp4Config(dequantize=True)}
