"""Full-precision compute at stored-precision memory: 16-bit weights upcast one layer at a time.

On a CPU ``--dtype auto`` computes in float32. Converting a bfloat16 (or float16) checkpoint to
float32 as a whole doubles it in memory; instead the model is loaded in its stored dtype and every
module runs with its own 16-bit parameters and buffers upcast to float32 for the call, dropped after.
A decoder layer is upcast whole (its parts may use each other's weights); the vocabulary's table is
widened a part at a time, the rows its tokens look up and the head's logits a chunk of rows at a time
(model/vocab_table.py), so the peak is the checkpoint plus one layer in float32. bf16/f16 → f32 is
exact and the hidden states between modules are float32, so the results are those of the whole-model
conversion, bit for bit. The buffers a model computes when it is built (rotary frequencies, Gemma's
embedding scale) are not in the checkpoint: built in 16 bits they would be rounded, so they are
taken from a float32 build of the same class on the meta device (its buffers are real, its
parameters are not).

The float32 copies are swapped into the modules' own parameter and buffer dicts, never written
into the stored Parameters: a tied table (embeddings and head) keeps one 16-bit Parameter, and
the run-time twins' and finders' hooks see float32 inputs and outputs as before. accelerate's own
``LayerwiseCastingHook`` casts leaf layers of a few classes in place (``module.to``), which misses
RMSNorms and fused experts and would narrow float32 buffers (rotary frequencies) after each call.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .rewiden import Rewidening
from .widening import STORED, WIDEN_ATTR, weight_count

_SAFETENSORS = {"BF16": torch.bfloat16, "F16": torch.float16}
_FLOATS = ("F64", "F32", "F16", "BF16")
# The model attribute that records the upcast compute dtype (``model.dtype`` reads a parameter's).
COMPUTE_ATTR = "_surgery_compute_dtype"


class _Upcast:
    """Forward pre/post hooks: swap ``module``'s 16-bit tensors (its subtree's when ``recurse``)
    for float32 copies for the call, and put the stored ones back after, even when the call fails.

    Only tensors still in a 16-bit dtype are swapped, so a hook inside an upcast layer does nothing. With
    gradients on, the copies autograd saves are saved as their widening (model/rewiden.py): the backward
    widens them again a call at a time instead of keeping every layer's."""

    def __init__(self, recurse: bool):
        self.recurse = recurse
        # a stack: a module may run re-entrantly
        self.calls: list[tuple[list[tuple[dict, str, torch.Tensor]], Rewidening | None]] = []

    def pre(self, module: nn.Module, args: tuple) -> None:
        swapped = []
        rewidening = Rewidening() if torch.is_grad_enabled() else None
        # The copies are made as the stored tensors are, outside inference mode and requiring grad as
        # they do: torch picks its matmul path by that (a weight that requires grad is not folded into
        # one GEMM), and with it the rounding, so only such copies give the whole conversion's bits.
        with torch.inference_mode(False):
            for owner in module.modules() if self.recurse else (module,):
                widen = getattr(owner, WIDEN_ATTR, {})
                for store in (owner._parameters, owner._buffers):
                    for name, tensor in store.items():
                        if tensor is not None and tensor.dtype in STORED:
                            store[name] = _widened(widen.get(name), tensor)
                            swapped.append((store, name, tensor))
                            if rewidening is not None:
                                rewidening.add(store[name], functools.partial(_widened, widen.get(name), tensor))
        if rewidening is not None and swapped:
            rewidening.__enter__()
        self.calls.append((swapped, rewidening if swapped else None))

    def post(self, module: nn.Module, args: tuple, output):
        swapped, rewidening = self.calls.pop()
        if rewidening is not None:
            rewidening.__exit__(None, None, None)
        for store, name, tensor in swapped:
            store[name] = tensor
        return None


def _widened(widen, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s float32 copy, by its widening function ``widen`` (held values) or converted; outside
    inference mode (also when the backward makes it again) and asking for a gradient as ``tensor`` does."""
    with torch.inference_mode(False):
        wide = widen(tensor) if widen is not None else tensor.detach().to(torch.float32)
        return wide.requires_grad_(tensor.requires_grad)


def stored_dtype(tensors: Mapping[str, Any]) -> torch.dtype | None:
    """The 16-bit dtype every floating tensor of a checkpoint is stored in (``tensors``: name →
    TensorInfo), or None when some are wider (loading those in 16 bits would round them)."""
    floats = {info.dtype for info in tensors.values() if info.dtype in _FLOATS}
    return _SAFETENSORS.get(floats.pop()) if len(floats) == 1 else None


def _full_precision_buffers(model: nn.Module) -> None:
    """Replace the 16-bit buffers ``model`` computed when it was built (the non-persistent ones: the
    checkpoint's own are loaded, and upcast per call) by a float32 build's."""
    from accelerate import init_empty_weights

    with init_empty_weights():  # parameters on meta; buffers are computed for real, in float32
        reference = type(model)._from_config(model.config, dtype=torch.float32)
    built = dict(reference.named_buffers())
    for name, buffer in list(model.named_buffers()):
        wide = built.get(name)
        owner_name, _, leaf = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        computed = leaf in owner._non_persistent_buffers_set
        if computed and buffer.dtype in STORED and wide is not None and wide.dtype == torch.float32:
            owner._buffers[leaf] = wide.to(buffer.device)


def _owns_stored(module: nn.Module) -> bool:
    """Whether ``module`` itself (not its children) holds a 16-bit parameter or buffer."""
    tensors = [*module._parameters.values(), *module._buffers.values()]
    return any(t is not None and t.dtype in STORED for t in tensors)


def attach(model: nn.Module) -> nn.Module:
    """Make ``model`` (loaded in a 16-bit dtype) compute in float32: each decoder layer is upcast
    whole for its call, and every other module holding 16-bit tensors is upcast on its own (the
    embeddings, final norm and head, or a layer's part called alone), but the vocabulary's table, which
    the embeddings and the head widen a part at a time, at most a decoder layer's size
    (model/vocab_table.py). Returns ``model``."""
    from .hooks import decoder_layers
    from .vocab_table import attach_table

    _full_precision_buffers(model)
    decoders = decoder_layers(model)
    table = attach_table(model, max(map(weight_count, decoders))) if decoders else set()
    layers = {id(m) for m in decoders}
    for module in model.modules():
        recurse = id(module) in layers
        if id(module) not in table and (recurse or _owns_stored(module)):
            hook = _Upcast(recurse)
            module.register_forward_pre_hook(hook.pre)
            module.register_forward_hook(hook.post, always_call=True)
    setattr(model, COMPUTE_ATTR, torch.float32)
    return model


def computed_value(module: nn.Module, name: str = "weight") -> torch.Tensor:
    """``module``'s tensor ``name`` in float32 as its forward computes with it: a 16-bit one upcast,
    held FP8 values dequantized (:data:`WIDEN_ATTR`), any other converted. What reads a weight
    outside a forward (find-neurons' PPM) reads it through this."""
    tensor = getattr(module, name)
    widen = getattr(module, WIDEN_ATTR, {}).get(name)
    if widen is not None and tensor.dtype in STORED:
        return widen(tensor)
    return tensor.detach().float()


def compute_dtype_of(model: nn.Module) -> torch.dtype:
    """The dtype ``model`` computes in: float32 when upcast by :func:`attach`, else its parameters'."""
    return getattr(model, COMPUTE_ATTR, None) or model.dtype
