"""Swap a few parameters of a loaded model for other values, and back, also under accelerate.

``surgery verify`` runs the source once with the run-time twins, then with only the edited tensors
replaced by the baked ones: one model in memory plus the edited tensors, never two models. A model
loaded with ``device_map`` keeps offloaded weights out of the module (on "meta") and hands them to
it at each forward from its ``AlignDevicesHook``'s ``weights_map``; such a weight is swapped in
that map, every other one with accelerate's ``set_module_tensor_to_device``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


class _Overlay(Mapping):
    """``base`` with some entries replaced (a hook's weights map is read-only to us)."""

    def __init__(self, base: Mapping, replaced: dict[str, torch.Tensor]):
        self.base, self.replaced = base, replaced

    def __getitem__(self, key: str) -> Any:
        return self.replaced[key] if key in self.replaced else self.base[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.base)

    def __len__(self) -> int:
        return len(self.base)


def _offload_hooks(module: nn.Module) -> list[Any]:
    """The offloading AlignDevicesHooks attached to ``module`` (directly or in a SequentialHook)."""
    hook = getattr(module, "_hf_hook", None)
    hooks = list(getattr(hook, "hooks", [hook] if hook is not None else []))
    return [h for h in hooks if getattr(h, "offload", False) and getattr(h, "weights_map", None) is not None]


def _swap_one(model: nn.Module, name: str, value: torch.Tensor) -> Callable[[], None]:
    """Give parameter ``name`` the content ``value``; return what puts the old one back."""
    from accelerate.utils import set_module_tensor_to_device

    old = model.get_parameter(name)
    value = value.to(old.dtype)
    parts = name.split(".")
    for depth in range(len(parts) - 1, -1, -1):  # the closest module that owns an offloading hook
        owner = model.get_submodule(".".join(parts[:depth]))
        for hook in _offload_hooks(owner):
            relative = ".".join(parts[depth:])
            if relative in hook.weights_map:
                base = hook.weights_map
                hook.weights_map = _Overlay(base, {relative: value})
                return lambda: setattr(hook, "weights_map", base)
    kept = old.data
    set_module_tensor_to_device(model, name, old.device, value=value)
    return lambda: set_module_tensor_to_device(model, name, kept.device, value=kept)


@contextmanager
def swapped(model: nn.Module, tensors: dict[str, torch.Tensor]) -> Iterator[nn.Module]:
    """Run ``model`` with the parameters named in ``tensors`` replaced; restored on exit, even on error."""
    from .dequantized import holds_codes

    if holds_codes(model):  # its parameters hold quantized values, not weights: a weight swapped in would be scaled
        raise ValueError("a model holding quantized values cannot have weights swapped in; load the baked checkpoint")
    undo: list[Callable[[], None]] = []
    try:
        for name, value in tensors.items():
            undo.append(_swap_one(model, name, value))
        yield model
    finally:
        for restore in reversed(undo):
            restore()
