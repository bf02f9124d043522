"""Load a checkpoint into a model built on the meta device, each tensor read once into the parameter of its
name: what ``from_pretrained`` does for such a checkpoint, without allocating the weights it does not find.

``from_pretrained`` of a quantized checkpoint loaded without its quantization (surgery/formats/) allocates
every weight the file stores in another form (codes, packed bytes) at its full float size, fills it with
random values and leaves surgery to overwrite it: the peak is the float model. Here the model is built with
its parameters on the meta device (accelerate's ``init_empty_weights``: the buffers it computes are real),
every other tensor of the file goes into its parameter or buffer as stored, and the caller puts the
quantized weights in as it holds them. This reproduces ``from_pretrained`` only where transformers loads
each tensor under its own name, in its own dtype; where it renames or converts a key (fused experts, a
wrapper's prefixes) or keeps a module in float32, :func:`load_by_name` says so (None) and the caller takes
``from_pretrained``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..core.checkpoint import Checkpoint
from ..core.errors import CheckpointError

# safetensors dtype → torch dtype name
_TORCH = {
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "I64": "int64",
    "I32": "int32",
    "I8": "int8",
    "U8": "uint8",
    "F8_E4M3": "float8_e4m3fn",
}


def read_tensor(folder: Path, info):
    """The stored tensor ``info`` (a ``TensorInfo`` of a file in ``folder``) as a torch tensor of its dtype,
    read into memory of its own: not a view of a memory map, whose file pages would count in the
    process's resident memory beside the copy."""
    import torch

    dtype = _TORCH.get(info.dtype)
    if dtype is None:
        raise CheckpointError(f"tensor '{info.name}' is stored as {info.dtype}, which surgery does not read here")
    data = torch.empty(info.nbytes, dtype=torch.uint8)
    with open(folder / info.file, "rb") as f:
        f.seek(info.start)
        got = f.readinto(memoryview(data.numpy()))
    if got != info.nbytes:
        raise CheckpointError(f"{info.file} ended early while reading '{info.name}'; the file is truncated")
    return data.view(getattr(torch, dtype)).reshape(info.shape)


def _empty_model(config, dtype):
    """The causal LM ``from_pretrained`` builds for ``config``, its parameters on meta, its buffers computed."""
    from accelerate import init_empty_weights

    from .loading import auto_class

    with init_empty_weights():
        return auto_class(config.model_type).from_config(config, dtype=dtype)


def _keeps_float32(model, dtype) -> bool:
    """Whether ``from_pretrained`` in ``dtype`` would keep some of ``model``'s modules in float32: its
    ``_keep_in_fp32_modules`` in float16 only, its ``_keep_in_fp32_modules_strict`` in either 16-bit dtype
    (gpt-oss names its norms in the first: in bfloat16 they load as stored)."""
    import torch

    if getattr(model, "_keep_in_fp32_modules_strict", None) and dtype in (torch.float16, torch.bfloat16):
        return True
    return bool(getattr(model, "_keep_in_fp32_modules", None)) and dtype == torch.float16


def _converted(model, keys: Iterable[str]) -> str | None:
    """A key of ``keys`` that transformers' loader would rename or convert for ``model`` (None: none)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    mapping = get_model_conversion_mapping(model)
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    meta = model.state_dict()
    for key in keys:
        renamed, pattern = rename_source_key(key, renamings, converters, model.base_model_prefix, meta)
        if renamed != key or pattern is not None:
            return key
    return None


def _slot(model, name: str) -> tuple[Any, str, Any] | None:
    """(owning module, leaf, its meta tensor) of parameter or buffer ``name``, or None."""
    owner, _, leaf = name.rpartition(".")
    try:
        module = model.get_submodule(owner)
    except AttributeError:
        return None
    for store in (module._parameters, module._buffers):
        if store.get(leaf) is not None:
            return module, leaf, store[leaf]
    return None


def load_by_name(ckpt: Checkpoint, config, dtype, quantized: Iterable[str], weights: Iterable[str]):
    """``ckpt``'s model (transformers ``config``, without its quantization) in ``dtype``, every stored tensor
    but the ``quantized`` ones in its parameter or buffer of the same name, the parameters ``weights`` (the
    quantized weights' plain names) left on the meta device for the caller; None where ``from_pretrained``
    would load the file otherwise: a key renamed or converted, a module kept in float32, a tensor with no
    parameter of its name, dtype and shape."""
    import torch

    model = _empty_model(config, dtype)
    if _keeps_float32(model, dtype):
        return None
    skip = set(quantized)
    plain = {n: info for n, info in ckpt.tensors.items() if n not in skip}
    weights = list(weights)
    if _converted(model, [*plain, *weights]) is not None:
        return None
    slots = {}
    for name, info in plain.items():
        slot = _slot(model, name)
        want = _TORCH.get(info.dtype)
        if slot is None or want is None or slot[2].dtype != getattr(torch, want):
            return None
        if tuple(slot[2].shape) != tuple(info.shape):
            return None
        slots[name] = slot
    for name in weights:
        slot = _slot(model, name)
        if slot is None or not isinstance(slot[2], torch.nn.Parameter):
            return None
    for name, info in plain.items():
        module, leaf, old = slots[name]
        tensor = read_tensor(ckpt.path, info)
        if isinstance(old, torch.nn.Parameter):
            module._parameters[leaf] = torch.nn.Parameter(tensor, requires_grad=old.requires_grad)
        else:
            module._buffers[leaf] = tensor
    model.config.name_or_path = str(ckpt.path)
    _generation_config(model, ckpt.path)
    return model


def _generation_config(model, path: Path) -> None:
    """The checkpoint's generation_config.json, as ``from_pretrained`` reads it (sampling defaults, stop ids)."""
    if not model.can_generate() or not (path / "generation_config.json").is_file():
        return
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig.from_pretrained(str(path))


def finish(model, ckpt: Checkpoint, what: str) -> None:
    """Tie ``model``'s tied weights, as ``from_pretrained`` does, and refuse in one line a parameter still on
    the meta device: no tensor of the checkpoint filled it (``what`` names its quantized weights)."""
    model.tie_weights()
    left = sorted(name for name, p in model.named_parameters() if p.device.type == "meta")
    if left:
        raise missing_refusal(ckpt, model, left, what)


def missing_refusal(ckpt: Checkpoint, model, left: list[str], what: str) -> CheckpointError:
    """The one line for parameters ``left`` that ``ckpt`` has no tensor for (``what``: its quantized weights)."""
    return CheckpointError(
        f"{ckpt.path} has no tensor for '{left[0]}'"
        + (f" (and {len(left) - 1} more)" if len(left) > 1 else "")
        + f", which the {type(model).__name__} needs and which is not one of its {what}s: "
        "the checkpoint is incomplete; re-download it"
    )
