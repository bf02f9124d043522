"""Widened weights saved for a backward as the way to make them again, not as their float32 bytes.

A call that widens stored weights for its matmuls (a decoder layer's upcast, model/upcast.py; a chunk of
the head, model/vocab_table.py) drops the float32 copies when it returns, so that one layer is widened at a
time. With gradients on (find-heads' attribution screen: activations only, the weights frozen), autograd
keeps every tensor a backward needs, the weight of each matmul included: every layer's float32 copy lived
until the backward, the float32 model whole. While such a call runs, :class:`Rewidening` saves a tensor that
is (a view of) one of its copies, unchanged since it was made, as the function that made it and the view's
geometry, and the backward makes it again from the stored bytes, one call's copies at a time. Widening is
deterministic (an exact bf16 → f32 conversion, or a fixed table lookup and product), so the backward sees
the same values at the same strides: its gradients are the kept copies', bit for bit.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

# The call whose remade copies are held: the backward of another call's tensors frees them (one layer's at
# a time). A weak reference: once autograd has released a call's saved tensors, its copies go with it.
_holding: list[weakref.ref | None] = [None]


@dataclass(frozen=True)
class _Remade:
    """A saved tensor, as the call that can make it again and its view of the remade copy."""

    call: _Call
    key: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


class _Call:
    """One call's registered copies, and their copies made again while the backward is at this call.

    Kept apart from :class:`Rewidening`, whose hooks are this object's methods: a hooks object whose hooks
    were its own bound methods referred to itself, a cycle that only Python's garbage collector broke, so the
    last call the backward remade kept its float32 copies (a whole layer) after the backward, until a
    collection; with this, they go as autograd releases the call's saved tensors."""

    def __init__(self) -> None:
        self.versions: dict[int, tuple] = {}  # storage → its copy's (version, dtype) when registered (in the call)
        self.remakes: dict[int, Callable[[], torch.Tensor]] = {}  # storage → how its copy is made again
        self.remade: dict[int, torch.Tensor] = {}  # the copies made again, while the backward is at this call

    def pack(self, tensor: torch.Tensor):
        if tensor.layout is not torch.strided or tensor.is_meta:
            return tensor
        key = tensor.untyped_storage().data_ptr()
        if self.versions.get(key) != (tensor._version, tensor.dtype):  # not a copy of this call, or written since
            # its values without its graph: a saved output (a softmax's, a norm's rsqrt) is handed to the hook with
            # its grad_fn, the very node that saves it, and kept as it is it would keep that node, and every
            # activation the graph saved, alive through a cycle no collector sees (autograd gives an unpacked
            # tensor back its place in the graph itself)
            return tensor.detach()
        return _Remade(self, key, tuple(tensor.size()), tuple(tensor.stride()), tensor.storage_offset())

    @staticmethod
    def unpack(saved):
        if not isinstance(saved, _Remade):
            return saved
        call = saved.call
        held = _holding[0]() if _holding[0] is not None else None
        if held is not call:
            if held is not None:
                held.remade.clear()
            _holding[0] = weakref.ref(call)
        if saved.key not in call.remade:
            call.remade[saved.key] = call.remakes[saved.key]()
        return call.remade[saved.key].as_strided(saved.size, saved.stride, saved.offset)


class Rewidening(torch.autograd.graph.saved_tensors_hooks):
    """``with Rewidening() as rw: ... rw.add(copy, remake) ...``: while active, a tensor autograd saves that
    shares a registered copy's storage, and whose data has not been written since it was registered, is
    saved as ``remake`` (which must return the same values, in a fresh tensor of the same layout)."""

    def __init__(self) -> None:
        self.call = _Call()
        super().__init__(self.call.pack, _Call.unpack)

    def add(self, copy: torch.Tensor, remake: Callable[[], torch.Tensor]) -> None:
        """Register ``copy``, a tensor this call made that ``remake`` makes again (a copy asking for a gradient
        is left alone: its saved self is the leaf its gradient goes to)."""
        key = copy.untyped_storage().data_ptr()
        if key and not copy.requires_grad:
            self.call.versions[key], self.call.remakes[key] = (copy._version, copy.dtype), remake

    def __enter__(self) -> Rewidening:
        super().__enter__()
        return self

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self.call.versions = {}  # the copies are dropped after the call: their addresses may be reused
