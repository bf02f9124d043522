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
and AutoAWQ write them), or all in float32 where the codes are held as stored (below), is not decoded whole (4 bytes a weight), on any integer layout, transformers'
own included: each weight is held as its codes less their zero points, small integers exact in that
dtype, and multiplied by its scales only for its layer's call (model/upcast.py), as FP8 values are
(surgery/formats/fp8/hold.py). compressed-tensors' float32 decode is that product, so the results are the
whole decode's, bit for bit.

Where transformers loads every other tensor under its own name (model/by_name.py) and the codes are
compressed-tensors' own (not AutoAWQ's, which its converter turns around whole), each weight is held as
the file stores it instead: its codes (I32 words, 8 int4 codes each, or I8) in a model built on the meta
device, its scales and unpacked zero points beside them, and for its layer's call the codes are unpacked
(each byte's codes from a 256-entry table of compressed-tensors' own unpacking), less their zero points
and times the same scales: the same float32 values, bit
for bit, at the file's size, with nothing allocated at the float size while loading.
"""

from __future__ import annotations

from typing import Any

from ...core.checkpoint import Checkpoint
from ...core.errors import CheckpointError
from ...model.by_name import finish, load_by_name, read_tensor
from ...model.dequantized import (
    Filler,
    attach_scalings,
    column_scaler,
    group_scaling,
    held_dtype,
    hold_packed,
    without_quantization,
)
from .plan import _stored, weight_factors, weight_values, weights_of
from .storage import IntWeight, Scheme, byte_codes


def layerwise_dtype(ckpt: Checkpoint, model_class) -> Any:
    """The dtype to load ``ckpt`` in for float32 compute a layer at a time, or None to decode it whole: the
    16-bit dtype of every other float tensor (its integer weights held in it as codes less zero points),
    or float32 where they are all float32 and the codes can be held as stored (:func:`load_packed`)."""
    weights = weights_of(ckpt)
    return held_dtype(ckpt, model_class, {w.scale.name for w in weights.values()}, wide=_packable(ckpt, weights))


def _packable(ckpt: Checkpoint, weights: dict[str, IntWeight]) -> bool:
    """Whether :func:`load_packed` can hold ``weights`` as stored, as far as the file says (the model's
    own names are asked as it loads): compressed-tensors' words, each row an even number of bytes."""
    return not ckpt.format.scheme.transposed and not any(w.codes.nbytes // w.shape[0] % 2 for w in weights.values())


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


def load_packed(ckpt: Checkpoint, config, dtype) -> Any:
    """``ckpt``'s model (transformers ``config``, without its quantization) in ``dtype``
    (:func:`layerwise_dtype`: 16-bit, or float32), each integer weight held as its stored codes, its scales and zero points,
    decoded for its layer's call; None where transformers would not load the other tensors by their names
    (model/by_name.py) or the codes are not compressed-tensors' own (AutoAWQ's)."""
    import torch

    s = ckpt.format.scheme
    weights = weights_of(ckpt)
    if s.packed:
        byte_codes(s.bits)  # compressed-tensors' unpacking, imported and tabulated as the model loads
    if not _packable(ckpt, weights):
        return None  # AutoAWQ's words, or rows of an odd number of bytes (not a 16-bit Parameter's)
    parts = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx")
    stored = {s.part(n, p) for n in weights for p in parts} | {w.codes.name for w in weights.values()}
    model = load_by_name(ckpt, without_quantization(config), dtype, stored & set(ckpt.tensors), weights)
    if model is None:
        return None
    for name, w in weights.items():
        raw, _, zero = _stored(ckpt, s, w)
        scale = read_tensor(ckpt.path, w.scale)  # as stored: widened to float32 exactly per call
        held = {"scale": scale.reshape(scale.shape[0] if scale.dim() > 1 else 1, -1)}
        if zero is not None:
            held["zero"] = zero
        hold_packed(model, name, torch.from_numpy(raw).view(torch.uint8), held, _decoder(s, w))
    finish(model, ckpt, f"{s.describe()} weight")
    return model


def _decoder(s: Scheme, w: IntWeight):
    """``decode(bytes, parts)``: the float32 values [out, in] of ``w`` from its held codes' bytes, its
        scales as stored ([out or 1, groups]) and its int8 zero points: compressed-tensors' unpacking, then
        (code − zero point) × its group's scale, as :func:`weight_factors` × the 16-bit hold's scaling; packed codes
    are looked up a byte at a time (:func:`~.storage.byte_codes`)."""
    import numpy as np
    import torch

    group_of = w.group_of()
    scale_columns = column_scaler(group_of, w.n_groups)
    of = torch.from_numpy(group_of.astype(np.int64))

    def decode(raw, parts):
        if s.packed:  # each byte's codes from the table, 3× faster here than unpacking the words
            table = byte_codes(s.bits).to(raw.device)
            units = torch.nn.functional.embedding(raw.to(torch.int32), table).reshape(raw.shape[0], -1)
            if units.shape[1] != w.shape[1]:  # the last word's padding
                units = units[:, : w.shape[1]].contiguous()
        else:
            units = raw.view(torch.int8).to(torch.float32)
        zero = parts.get("zero")
        if zero is not None:
            units -= zero.to(torch.float32)[:, of.to(zero.device)] if zero.dim() == 2 else zero.to(torch.float32)
        scale_columns(units, parts["scale"].to(torch.float32))
        return units

    return decode
