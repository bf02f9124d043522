"""Holding quantized weights for computation, whatever their format: what surgery/formats/ loads with.

A format transformers cannot dequantize exactly loads without its quantization, and each weight is then
put in as its float values (:class:`Filler`, one tensor at a time; a mixture of experts stored one
tensor per expert is loaded into fused 3-D parameters, and each expert's matrix goes to its rows of
them: the architecture table's ``fused_homes``). For float32 compute, a checkpoint whose other
weights are stored in one 16-bit dtype (:func:`held_dtype`) is not dequantized whole (4 bytes a
weight): its weights are held as their stored values, exact in that dtype, and each is multiplied by
its scales only for its layer's call (:func:`attach_scalings`, model/upcast.py), so memory stays near
twice the quantized file; held as their stored bytes (:func:`hold_packed`), at the file's size, and so
also where the other weights are all float32. surgery/formats/fp8/hold.py and surgery/formats/int_packed/hold.py say what
each format holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import contextmanager
from typing import Any

from ..core.checkpoint import Checkpoint
from ..core.errors import CheckpointError

HOLDS_CODES = "_surgery_holds_codes"  # set on a model by attach_scalings: its parameters are not its weights


def without_quantization(config):
    """``config`` (a transformers config, changed in place; the file is not) without its
    quantization_config, nor its text config's: from_pretrained then loads the stored tensors as they are."""
    for cfg in (config, getattr(config, "text_config", None)):
        if cfg is not None and hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
    return config


@contextmanager
def quiet_load(unquantized: bool):
    """Silence what transformers says about a format's load: that the given quantization_config's
    loading attributes (dequantize) override the checkpoint's, and, ``unquantized`` (the checkpoint
    loads without its quantization), its report listing every scale tensor as unused (the format's
    fill uses them). Other warnings pass."""
    import warnings

    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    if unquantized:
        hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="You passed `quantization_config`", category=UserWarning)
            yield
    finally:
        hf_logging.set_verbosity(level)


class Filler:
    """Puts the float values of a checkpoint's weights, one at a time, into a model transformers loaded
    without them: into the parameter of the weight's name or, for one expert's matrix of a checkpoint
    stored one tensor per expert, into its rows of the fused parameter transformers loads it into."""

    def __init__(self, model, config, stored: Iterable[str], what: str):
        """``stored``: the checkpoint's weight names; ``what`` names a weight in a refusal."""
        self.model, self.config, self.stored, self.what = model, config, list(stored), what
        self.parameters = dict(model.named_parameters())
        self.filled: set[str] = set()  # the parameters written to
        self._homes: dict | None = None  # asked of the table only when a weight is not a parameter of its name

    def homes(self) -> dict[str, tuple[str, int, tuple[int, ...], bool]]:
        if self._homes is None:
            self._homes = fused_homes(self.config, self.stored, self.parameters)
        return self._homes

    def put(self, name: str, value) -> None:
        """Copy ``value`` (a float [out, in] tensor) of the checkpoint weight ``name`` into the model."""
        import torch

        home = None if name in self.parameters else self.homes().get(name)
        target = name if home is None else home[0]
        if target not in self.parameters:
            raise CheckpointError(
                f"{self.what} '{name}' is not a parameter of the loaded {type(self.model).__name__} (transformers "
                "renames it), so surgery cannot dequantize it into it; use the full-precision release"
            )
        param = self.parameters[target]
        if param.device.type == "meta":
            raise CheckpointError(
                f"{self.what} '{name}' was offloaded by --device-map, but surgery must dequantize it as it loads: "
                "give --max-memory enough room for the whole model, or drop --device-map"
            )
        with torch.no_grad():
            if home is None:
                param.copy_(value)
            else:
                _, expert, rows, flipped = home
                index, slab = torch.tensor(rows, device=param.device), param[expert]
                if flipped:
                    slab[:, index] = value.T.to(param)
                else:
                    slab[index] = value.to(param)
        self.filled.add(target)


def fused_homes(config, stored, loaded) -> dict[str, tuple[str, int, tuple[int, ...], bool]]:
    """Where the loaded model (parameter names ``loaded``) keeps each per-expert matrix of a checkpoint
    (tensor names ``stored``; transformers fuses a layer's experts into 3-D parameters as it loads):
    the architecture table's answer."""
    from ..core.architectures import architecture

    arch = architecture(config)
    if arch.layout.experts is None:
        return {}
    return arch.fused_homes(stored, loaded)


def held_dtype(ckpt: Checkpoint, model_class, quantized: set[str], wide: bool = False) -> Any:
    """The 16-bit torch dtype every tensor of ``ckpt`` but its ``quantized`` ones (the stored values and
    their scales) is stored in, or float32 where ``model_class`` (transformers) keeps it in float32
    whatever the load dtype (``_keep_in_fp32_modules_strict``, e.g. DeepSeek-V3's router bias); None
    when another is wider: loading it in 16 bits would round it. ``wide`` (a caller that holds its
    quantized weights as their stored bytes, :func:`hold_packed`, which needs no 16-bit load): a rest
    stored wholly in float32, as a float32 import is, is held too, in float32."""
    import torch

    from .upcast import stored_dtype

    kept32 = tuple(getattr(model_class, "_keep_in_fp32_modules_strict", None) or ())
    rest = {
        n: info
        for n, info in ckpt.tensors.items()
        if n not in quantized and not (info.dtype == "F32" and any(k in n for k in kept32))
    }
    if not rest:
        return None
    floats = {info.dtype for info in rest.values() if info.dtype in ("F64", "F32", "F16", "BF16")}
    if wide and floats == {"F32"}:
        return torch.float32
    return stored_dtype(rest)


# A weight's scaling: multiplies its held values, widened to float32 ([rows, cols], contiguous), by its
# scales in place.
Scaling = Callable[[Any], None]


def group_scaling(scale, group_of):
    """Multiplies a weight's float32 values [out, in] in place by its scales [out or 1, groups] (numpy),
    each column by its group's (:func:`column_scaler`)."""
    import torch

    scale, apply = torch.from_numpy(scale), column_scaler(group_of, scale.shape[1])
    return lambda block: apply(block, scale)


def column_scaler(group_of, groups: int) -> Callable[[Any, Any], None]:
    """``apply(block, scale)``: multiplies float32 values [out, in] in place by ``scale`` [out or 1, groups]
    (a torch tensor), each column by its group's (``group_of``: each column's group): a view when the groups
    are contiguous runs of columns (no copy: 5× faster than spreading the scales over every column, which
    actorder's scattered groups need)."""
    import numpy as np
    import torch

    n = len(group_of)
    if n % groups == 0 and np.array_equal(group_of, np.arange(n) // (n // groups)):
        return lambda block, scale: block.view(block.shape[0], groups, -1).mul_(scale[:, :, None].to(block.device))
    of = torch.from_numpy(group_of.astype(np.int64))
    return lambda block, scale: block.mul_(scale[:, of.to(scale.device)].to(block.device))


def attach_scalings(model, config, stored: Iterable[str], scalings: dict[str, Scaling], what: str) -> None:
    """Make each checkpoint weight named in ``scalings`` its held values (its parameter, or its rows of a
    fused experts parameter: :func:`fused_homes`) scaled by its scaling, as the layer runs (model/upcast.py);
    ``stored``: the checkpoint's tensor names, ``what`` names a weight in a refusal."""
    parameters = {name for name, _ in model.named_parameters()}
    homes: dict[str, list] = {}
    fused = None  # asked of the table only when a weight is not a parameter under its own name
    for name, scaling in scalings.items():
        if name in parameters:
            owner, _, leaf = name.rpartition(".")
            _widen_map(model.get_submodule(owner))[leaf] = _scaled(scaling)
            continue
        fused = fused_homes(config, stored, parameters) if fused is None else fused
        if name not in fused:
            raise CheckpointError(
                f"{what} '{name}' is not a parameter of the loaded {type(model).__name__} (transformers "
                "renames it), so surgery cannot dequantize it; use the full-precision release"
            )
        target, expert, rows, flipped = fused[name]
        homes.setdefault(target, []).append((expert, rows, flipped, scaling))
    for name, parts in homes.items():
        owner, _, leaf = name.rpartition(".")
        _widen_map(model.get_submodule(owner))[leaf] = _scaled_experts(parts)
    setattr(model, HOLDS_CODES, True)


def hold_packed(model, name: str, packed, parts: dict[str, Any], decode: Callable) -> None:
    """Hold the weight ``name`` of ``model`` (a parameter on the meta device, from model/by_name.py) as its
    stored bytes ``packed`` (a uint8 tensor: one e4m3 value, or two or more codes, a byte) and its stored ``parts`` (scales,
    global scale: buffers of its module named ``<leaf>_<part>``), made its float32 values only for its
    layer's call (model/upcast.py) by ``decode(bytes, parts)``: the parameter's float32 values ([out, in] for
    a linear's weight, [experts, in, out] for gpt-oss's fused experts).

    The bytes are a Parameter of the module's dtype (bfloat16 in a float32 module), viewed, not converted
    (``packed`` must have an even number of bytes a row): the layer's upcast then finds it as it finds a 16-bit weight, and it asks for
    a gradient as a loaded weight does (torch picks its matmul path by that: model/upcast.py)."""
    import torch

    from .widening import STORED

    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner)
    old = module._parameters[leaf]
    # A 16-bit view is what the layer's upcast widens; in a float32 model (a float32 rest) it is bfloat16.
    view = old.dtype if old.dtype in STORED else torch.bfloat16
    module._parameters[leaf] = torch.nn.Parameter(packed.view(view), requires_grad=old.requires_grad)
    for part, value in parts.items():
        module.register_buffer(f"{leaf}_{part}", value, persistent=False)

    def widen(held):
        stored = {part: module._buffers[f"{leaf}_{part}"] for part in parts}
        return decode(held.detach().view(torch.uint8), stored)

    widen.numel = old.numel()  # the weights it holds (model/widening.py's ``weight_count``), not its bytes
    _widen_map(module)[leaf] = widen
    setattr(model, HOLDS_CODES, True)


def holds_codes(model) -> bool:
    """Whether ``model`` holds quantized values (e4m3, or integer codes less their zero points) that
    become its weights only as its layers run (:func:`attach_scalings`): its parameters are then not the
    weights, and must not be read or swapped directly."""
    return bool(getattr(model, HOLDS_CODES, False))


def _widen_map(module) -> dict[str, Callable]:
    from .widening import WIDEN_ATTR

    if not hasattr(module, WIDEN_ATTR):
        setattr(module, WIDEN_ATTR, {})
    return getattr(module, WIDEN_ATTR)


def _scaled(scaling: Scaling) -> Callable:
    """held values [out, in] → their float32 weights, scaled: exact (float32 holds each product)."""
    import torch

    def widen(held):
        wide = held.detach().to(torch.float32)
        scaling(wide)
        return wide

    return widen


def _scaled_experts(parts: list) -> Callable:
    """held fused experts → float32 weights: each expert's matrix, at its rows of the fused
    parameter (:func:`fused_homes`), scaled by that matrix's own scaling."""
    import torch

    def widen(held):
        wide = held.detach().to(torch.float32)
        for expert, rows, flipped, scaling in parts:
            index = torch.tensor(rows, device=wide.device)
            target = wide[expert]
            if flipped:  # stored [in, out]: the matrix is its columns, transposed
                matrix = target[:, index].T.contiguous()
                scaling(matrix)
                target[:, index] = matrix.T
            else:
                matrix = target[index]
                scaling(matrix)
                target[index] = matrix
        return wide

    return widen
