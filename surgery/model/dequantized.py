"""Load an FP8 (e4m3) checkpoint for computation, dequantized: finders and evaluation see the values a
bake edits (each e4m3 value times its scale, exact in float32), on a CPU as on an accelerator.

transformers dequantizes as it loads (``FineGrainedFP8Config`` / ``CompressedTensorsConfig`` with
``dequantize=True``), but it takes a block's size from the scale grid (rows // scale rows), so a block
layout whose weights are not whole blocks (128×128 blocks on a dimension that is not a multiple of
128) comes out wrong without an error. Such a checkpoint loads with its e4m3 bytes as plain floats,
and each FP8 weight is then replaced by surgery's own dequantization (surgery/quant/fp8.py), one
tensor at a time; a mixture of experts stored one tensor per expert is loaded into fused 3-D
parameters, and each expert's matrix goes to its rows of them (the architecture table's
``fused_homes``).

For float32 compute, a checkpoint whose other weights are stored in one 16-bit dtype is not
dequantized whole (4 bytes a weight): its e4m3 values are loaded in that dtype (exact: e4m3 fits
bfloat16 and float16), and each decoder layer's weights are dequantized, with surgery's own exact
arithmetic, only for the layer's call (model/upcast.py), so memory stays near twice the FP8 file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import contextmanager
from typing import Any

from ..core.checkpoint import Checkpoint, TensorInfo
from ..core.errors import CheckpointError
from ..quant import fp8

HOLDS_CODES = "_surgery_holds_codes"  # set on a model by attach_scalings: its parameters are not its weights


def whole_blocks(ckpt: Checkpoint) -> bool:
    """Whether every FP8 weight of ``ckpt`` is whole blocks (or one block) along each dimension: then
    transformers' dequantization, which infers the block from the scale grid, gives its exact values."""
    block = ckpt.fp8_scheme.block
    if block is None:  # per tensor or per channel: nothing to infer
        return True
    return all(
        n % b == 0 or n <= b
        for info in ckpt.tensors.values()
        if info.dtype == fp8.DTYPE
        for n, b in zip(info.shape, block)
    )


def load_arguments(ckpt: Checkpoint, config, held: bool = False) -> dict[str, Any]:
    """from_pretrained's arguments that load the FP8 checkpoint ``ckpt`` (transformers ``config``) dequantized:
    transformers' own dequantization where it is exact, else the config without its quantization
    (the weights are then filled by :func:`fill_weights`, or, ``held``, dequantized as each layer
    runs: :func:`attach_scales`)."""
    if whole_blocks(ckpt) and not held:
        from transformers import CompressedTensorsConfig, FineGrainedFP8Config

        method = ckpt.fp8_scheme.method
        quant = FineGrainedFP8Config(dequantize=True) if method == "fp8" else CompressedTensorsConfig(dequantize=True)
        return {"quantization_config": quant}
    return {"config": without_quantization(config)}


def without_quantization(config):
    """``config`` (a transformers config, changed in place; the file is not) without its
    quantization_config, nor its text config's: from_pretrained then loads the stored tensors as they are."""
    for cfg in (config, getattr(config, "text_config", None)):
        if cfg is not None and hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
    return config


@contextmanager
def quiet_load(ckpt: Checkpoint, held: bool = False):
    """Silence what transformers says about the load :func:`load_arguments` asked for: that the given
    quantization_config's loading attributes (dequantize) override the checkpoint's, and, when the
    checkpoint loads without quantization, its report listing every scale tensor as unused (:func:`fill_weights`
    uses them). Other warnings pass."""
    import warnings

    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    if held or not whole_blocks(ckpt):
        hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="You passed `quantization_config`", category=UserWarning)
            yield
    finally:
        hf_logging.set_verbosity(level)


def dequantized_weight(ckpt: Checkpoint, info: TensorInfo):
    """The float32 values of the FP8 weight ``info`` (e4m3 × its scales, exact), as a torch tensor."""
    import torch
    from safetensors import safe_open

    scheme = ckpt.fp8_scheme
    scale_info = ckpt.tensor(scheme.scale_name(info.name))
    lay = fp8.layout(scheme, info.name, info.shape, scale_info.name, scale_info.shape)
    with safe_open(ckpt.path / info.file, "pt") as f:
        raw = f.get_tensor(info.name).view(torch.uint8).numpy()
    with safe_open(ckpt.path / scale_info.file, "pt") as f:
        scale = f.get_tensor(scale_info.name).float().numpy()
    return torch.from_numpy(fp8.dequantize(raw, scale, lay, 0))


def fill_weights(model, ckpt: Checkpoint) -> None:
    """Put the exact dequantized value of every FP8 weight of ``ckpt`` into ``model`` (loaded by
    :func:`load_arguments` without quantization: not :func:`whole_blocks`), one tensor at a time."""
    block = ckpt.fp8_scheme.block
    what = f"FP8 weight with partial {block[0]}×{block[1]} blocks" if block else "FP8 weight"
    filler = Filler(model, ckpt.config, ckpt.tensors, what)
    for info in ckpt.tensors.values():
        if info.dtype == fp8.DTYPE:
            filler.put(info.name, dequantized_weight(ckpt, info))


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


def layerwise_dtype(ckpt: Checkpoint, model_class) -> Any:
    """The 16-bit torch dtype to hold ``ckpt``'s FP8 values in for layer-by-layer dequantization, or
    None to dequantize it whole (:func:`held_dtype`)."""
    scheme = ckpt.fp8_scheme
    weights = [n for n, info in ckpt.tensors.items() if info.dtype == fp8.DTYPE]
    return held_dtype(ckpt, model_class, {*weights, *(scheme.scale_name(n) for n in weights)}) if weights else None


def held_dtype(ckpt: Checkpoint, model_class, quantized: set[str]) -> Any:
    """The 16-bit torch dtype every tensor of ``ckpt`` but its ``quantized`` ones (the stored values and
    their scales) is stored in, or float32 where ``model_class`` (transformers) keeps it in float32
    whatever the load dtype (``_keep_in_fp32_modules_strict``, e.g. DeepSeek-V3's router bias); None
    when another is wider: loading it in 16 bits would round it."""
    from .upcast import stored_dtype

    kept32 = tuple(getattr(model_class, "_keep_in_fp32_modules_strict", None) or ())
    rest = {
        n: info
        for n, info in ckpt.tensors.items()
        if n not in quantized and not (info.dtype == "F32" and any(k in n for k in kept32))
    }
    return stored_dtype(rest) if rest else None


# A weight's scaling: multiplies its held values, widened to float32 ([rows, cols], contiguous), by its
# scales in place.
Scaling = Callable[[Any], None]


def attach_scales(model, ckpt: Checkpoint) -> None:
    """Give each module of ``model`` (loaded by :func:`load_arguments` without quantization, in
    :func:`layerwise_dtype`) what turns its held e4m3 values into the weights: times the FP8
    weight's scales, read from ``ckpt`` (small), applied by model/upcast.py as the layer runs."""
    scalings = {
        info.name: _fp8_scaling(*_scale_of(ckpt, info)) for info in ckpt.tensors.values() if info.dtype == fp8.DTYPE
    }
    attach_scalings(model, ckpt.config, ckpt.tensors, scalings, "FP8 weight")


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


def holds_codes(model) -> bool:
    """Whether ``model`` holds quantized values (e4m3, or integer codes less their zero points) that
    become its weights only as its layers run (:func:`attach_scalings`): its parameters are then not the
    weights, and must not be read or swapped directly."""
    return bool(getattr(model, HOLDS_CODES, False))


def _widen_map(module) -> dict[str, Callable]:
    from .upcast import WIDEN_ATTR

    if not hasattr(module, WIDEN_ATTR):
        setattr(module, WIDEN_ATTR, {})
    return getattr(module, WIDEN_ATTR)


def _scale_of(ckpt: Checkpoint, info: TensorInfo):
    """The float32 scales of the FP8 weight ``info`` (a numpy array) and its layout."""
    from safetensors import safe_open

    scheme = ckpt.fp8_scheme
    scale_info = ckpt.tensor(scheme.scale_name(info.name))
    lay = fp8.layout(scheme, info.name, info.shape, scale_info.name, scale_info.shape)
    with safe_open(ckpt.path / scale_info.file, "pt") as f:
        return f.get_tensor(scale_info.name).float().numpy(), lay


def _fp8_scaling(scale, lay: fp8.Layout) -> Scaling:
    """An FP8 weight's scales spread over its elements, as :func:`fp8.dequantize` applies them."""
    import torch

    return lambda block: block.mul_(torch.from_numpy(fp8.expand(scale, lay, 0, *block.shape)).to(block.device))


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
