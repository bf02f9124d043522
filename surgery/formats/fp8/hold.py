"""Load an FP8 (e4m3) checkpoint for computation, dequantized: finders and evaluation see the values a
bake edits (each e4m3 value times its scale, exact in float32), on a CPU as on an accelerator.

transformers dequantizes as it loads (``FineGrainedFP8Config`` / ``CompressedTensorsConfig`` with
``dequantize=True``), but it takes a block's size from the scale grid (rows // scale rows), so a block
layout whose weights are not whole blocks (128×128 blocks on a dimension that is not a multiple of
128) comes out wrong without an error. Such a checkpoint loads with its e4m3 bytes as plain floats,
and each FP8 weight is then replaced by surgery's own dequantization (storage.py), one tensor at a
time (model/dequantized.py's ``Filler``: a mixture of experts stored one tensor per expert goes to its
rows of the fused 3-D parameters).

For float32 compute, a checkpoint whose other weights are stored in one 16-bit dtype, or all in
float32 (a float32 import quantized), is not dequantized whole (4 bytes a weight): where transformers
loads every other tensor under its own name (model/by_name.py), each e4m3 weight is held as its stored
bytes (:func:`load_bytes`, memory near the FP8 file's size), else its e4m3 values are loaded in the
16-bit dtype (exact: e4m3 fits bfloat16 and float16); either way each decoder layer's weights are
dequantized, with surgery's own arithmetic, only for the layer's call (model/upcast.py), to the same
float32 values bit for bit.
"""

from __future__ import annotations

from typing import Any

from ...core import e4m3
from ...core.checkpoint import Checkpoint, TensorInfo
from ...model.dequantized import Filler, Scaling, attach_scalings, column_scaler, held_dtype, without_quantization
from .storage import ScaleLayout, dequantize, layout


def whole_blocks(ckpt: Checkpoint) -> bool:
    """Whether every FP8 weight of ``ckpt`` is whole blocks (or one block) along each dimension: then
    transformers' dequantization, which infers the block from the scale grid, gives its exact values."""
    block = ckpt.format.scheme.block
    if block is None:  # per tensor or per channel: nothing to infer
        return True
    return all(
        n % b == 0 or n <= b
        for info in ckpt.tensors.values()
        if info.dtype == e4m3.DTYPE
        for n, b in zip(info.shape, block)
    )


def load_arguments(ckpt: Checkpoint, config, held: bool = False) -> dict[str, Any]:
    """from_pretrained's arguments that load the FP8 checkpoint ``ckpt`` (transformers ``config``) dequantized:
    transformers' own dequantization where it is exact, else the config without its quantization
    (the weights are then filled by :func:`fill_weights`, or, ``held``, dequantized as each layer
    runs: :func:`attach_scales`)."""
    if whole_blocks(ckpt) and not held:
        from transformers import CompressedTensorsConfig, FineGrainedFP8Config

        method = ckpt.format.scheme.method
        quant = FineGrainedFP8Config(dequantize=True) if method == "fp8" else CompressedTensorsConfig(dequantize=True)
        return {"quantization_config": quant}
    return {"config": without_quantization(config)}


def dequantized_weight(ckpt: Checkpoint, info: TensorInfo):
    """The float32 values of the FP8 weight ``info`` (e4m3 × its scales, exact), as a torch tensor."""
    import torch
    from safetensors import safe_open

    scheme = ckpt.format.scheme
    scale_info = ckpt.tensor(scheme.scale_name(info.name))
    lay = layout(scheme, info.name, info.shape, scale_info.name, scale_info.shape)
    with safe_open(ckpt.path / info.file, "pt") as f:
        raw = f.get_tensor(info.name).view(torch.uint8).numpy()
    with safe_open(ckpt.path / scale_info.file, "pt") as f:
        scale = f.get_tensor(scale_info.name).float().numpy()
    return torch.from_numpy(dequantize(raw, scale, lay, 0))


def fill_weights(model, ckpt: Checkpoint) -> None:
    """Put the exact dequantized value of every FP8 weight of ``ckpt`` into ``model`` (loaded by
    :func:`load_arguments` without quantization: not :func:`whole_blocks`), one tensor at a time."""
    block = ckpt.format.scheme.block
    what = f"FP8 weight with partial {block[0]}×{block[1]} blocks" if block else "FP8 weight"
    filler = Filler(model, ckpt.config, ckpt.tensors, what)
    for info in ckpt.tensors.values():
        if info.dtype == e4m3.DTYPE:
            filler.put(info.name, dequantized_weight(ckpt, info))


def layerwise_dtype(ckpt: Checkpoint, model_class) -> Any:
    """The dtype to load ``ckpt`` in for layer-by-layer dequantization, or None to dequantize it whole
    (:func:`held_dtype`): its other weights' 16-bit dtype, or float32 where they are all float32 and its
    e4m3 weights can be held as their bytes (:func:`load_bytes`)."""
    weights = _fp8_weights(ckpt)
    if not weights:
        return None
    bytes_held = all(len(info.shape) == 2 and info.shape[1] % 2 == 0 for info in weights.values())
    return held_dtype(ckpt, model_class, _stored_names(ckpt, weights), wide=bytes_held)


def _fp8_weights(ckpt: Checkpoint) -> dict[str, TensorInfo]:
    return {n: info for n, info in ckpt.tensors.items() if info.dtype == e4m3.DTYPE}


def _stored_names(ckpt: Checkpoint, weights) -> set[str]:
    """The FP8 weights' tensors and their scales' (what a held load does not take as it is stored)."""
    return {*weights, *(ckpt.format.scheme.scale_name(n) for n in weights)}


def load_bytes(ckpt: Checkpoint, config, dtype) -> Any:
    """``ckpt``'s model (transformers ``config``, without its quantization) in ``dtype`` (:func:`layerwise_dtype`),
    each FP8 weight held as its stored e4m3 bytes (one a weight: half the 16-bit hold, a quarter of float32)
    and made float32 (e4m3 × its scales, as :func:`attach_scales` does) for its layer's call; None where
    transformers would not load the other tensors by their names (model/by_name.py: fused experts, a
    module kept in float32, a tensor such as an activation scale that is no parameter) or a weight's row
    is an odd number of bytes (not a 16-bit Parameter's)."""
    import torch

    from ...model.by_name import finish, load_by_name, read_tensor
    from ...model.dequantized import hold_packed

    weights = _fp8_weights(ckpt)
    if not weights or any(len(info.shape) != 2 or info.shape[1] % 2 for info in weights.values()):
        return None
    model = load_by_name(ckpt, without_quantization(config), dtype, _stored_names(ckpt, weights), weights)
    if model is None:
        return None
    for name, info in weights.items():
        scaling = _fp8_scaling(*_scale_of(ckpt, info))

        def decode(raw, parts, scaling=scaling):
            wide = _e4m3_values(raw)
            scaling(wide)
            return wide

        hold_packed(model, name, read_tensor(ckpt.path, info).view(torch.uint8), {}, decode)
    finish(model, ckpt, "FP8 weight")
    return model


def attach_scales(model, ckpt: Checkpoint) -> None:
    """Give each module of ``model`` (loaded by :func:`load_arguments` without quantization, in
    :func:`layerwise_dtype`) what turns its held e4m3 values into the weights: times the FP8
    weight's scales, read from ``ckpt`` (small), applied by model/upcast.py as the layer runs."""
    scalings = {
        info.name: _fp8_scaling(*_scale_of(ckpt, info)) for info in ckpt.tensors.values() if info.dtype == e4m3.DTYPE
    }
    attach_scalings(model, ckpt.config, ckpt.tensors, scalings, "FP8 weight")


def _e4m3_values(raw):
    """The float32 values of e4m3 bytes (a uint8 tensor), exact: surgery's table of the 256 codes, looked
    up by numpy on a CPU (:func:`e4m3.decode`, 4× torch's own conversion there), by torch elsewhere."""
    import torch

    if raw.device.type == "cpu":
        return torch.from_numpy(e4m3.decode(raw.numpy()))
    return torch.from_numpy(e4m3.values()).to(raw.device)[raw.long()]


def _scale_of(ckpt: Checkpoint, info: TensorInfo):
    """The float32 scales of the FP8 weight ``info`` (a numpy array) and its layout."""
    from safetensors import safe_open

    scheme = ckpt.format.scheme
    scale_info = ckpt.tensor(scheme.scale_name(info.name))
    lay = layout(scheme, info.name, info.shape, scale_info.name, scale_info.shape)
    with safe_open(ckpt.path / scale_info.file, "pt") as f:
        return f.get_tensor(scale_info.name).float().numpy(), lay


def _fp8_scaling(scale, lay: ScaleLayout) -> Scaling:
    """An FP8 weight's scales applied to its elements as :func:`~.storage.dequantize` applies them (each
    element times its block's float32 scale): the scale grid's rows spread over the weight's rows, then
    each column times its column block's (a view for whole blocks: no weight-sized scale array is made)."""
    import numpy as np
    import torch

    grid = torch.from_numpy(np.ascontiguousarray(scale.reshape(-1, 1) if scale.ndim < 2 else scale))

    def apply(block):
        n_rows, n_cols = block.shape
        rows = (torch.arange(n_rows) // lay.rows).clamp_(max=grid.shape[0] - 1)
        cols = (np.arange(n_cols) // lay.cols).clip(max=grid.shape[1] - 1)
        column_scaler(cols, grid.shape[1])(block, grid.index_select(0, rows))

    return apply
