"""Write a safetensors file tensor by tensor, byte for byte as ``safetensors.torch.save_file`` writes it.

``save_file`` needs every tensor of the file in memory at once: it sorts them, writes the header, then
each tensor's bytes. Here each tensor's bytes go to a spool file as the tensor is handed over, so the
caller can free it at once; :meth:`SpooledSafetensors.finish` then writes the header ``save_file``
would write and copies the spooled bytes into place in the kernel (``copy_file_range``), in
``save_file``'s order. Memory holds the names and shapes, never the data.

The format (safetensors' own ``prepare``): an 8-byte little-endian header length, the header as
compact JSON (``__metadata__`` first, then one entry per tensor: dtype, shape, data offsets) padded
with spaces to a multiple of 8 bytes, then the tensors' bytes back to back. The tensors are ordered by
dtype (safetensors' ``Dtype`` enum, descending) and then by name: that order is asked of the installed
safetensors itself, which sorts a copy of the file's names with empty tensors of the same dtypes.
"""

from __future__ import annotations

import errno
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .kernel_copy import kernel_copy
from .strict_files import load_json

# Bytes copied by one pread/pwrite where the kernel cannot copy between the two files.
COPY_BYTES = 16 << 20
# Bytes handed to one write(): Linux writes at most about 2 GB per call.
WRITE_BYTES = 1 << 30


@dataclass(frozen=True)
class _Spooled:
    dtype: Any  # torch.dtype
    shape: tuple[int, ...]
    offset: int  # in the spool file
    nbytes: int


class SpooledSafetensors:
    """One safetensors file in the making: :meth:`add` tensors, then :meth:`finish` (or :meth:`discard`)."""

    def __init__(self, spool: Path):
        self.spool = spool
        self.tensors: dict[str, _Spooled] = {}
        self.nbytes = 0
        self._fd: int | None = None

    def add(self, name: str, tensor: Any) -> None:
        """Spool ``tensor``'s bytes (a CPU ``torch.Tensor``; made contiguous here); the caller may free it."""
        import torch

        if name in self.tensors:
            raise ValueError(f"{name} is already in {self.spool.name}")
        if tensor.dtype == getattr(torch, "float4_e2m1fn_x2", None):
            # safetensors records the logical shape of this packed type, not the stored one.
            raise ValueError(f"{name}: packed float4 tensors are not written by the spooled writer")
        if self._fd is None:
            self._fd = os.open(self.spool, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += os.pwrite(self._fd, view[done : done + WRITE_BYTES], self.nbytes + done)
        self.tensors[name] = _Spooled(tensor.dtype, tuple(tensor.shape), self.nbytes, len(view))
        self.nbytes += len(view)

    def finish(self, path: Path, metadata: dict[str, str] | None = None) -> None:
        """Write ``path`` as ``save_file(tensors, path, metadata)`` would, and remove the spool."""
        order, codes = _save_file_order(self.tensors)
        header: dict[str, Any] = {}
        if metadata is not None:  # one key (as the import writes) keeps the header deterministic
            header["__metadata__"] = metadata
        start = 0
        for name in order:
            t = self.tensors[name]
            header[name] = {"dtype": codes[name], "shape": list(t.shape), "data_offsets": [start, start + t.nbytes]}
            start += t.nbytes
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        text += b" " * (-len(text) % 8)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            head = struct.pack("<Q", len(text)) + text
            _write_all(fd, head, 0)
            pos = len(head)
            for name in order:
                t = self.tensors[name]
                if t.nbytes:
                    _copy(self._fd, fd, t.offset, pos, t.nbytes)
                pos += t.nbytes
        finally:
            os.close(fd)
        self.discard()

    def discard(self) -> None:
        """Close and remove the spool (nothing of it stays on disk)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.spool.unlink(missing_ok=True)


def _save_file_order(tensors: dict[str, _Spooled]) -> tuple[list[str], dict[str, str]]:
    """The names in the order ``save_file`` writes them, and each one's safetensors dtype code, as the
    installed safetensors gives them for empty tensors of the same names and dtypes."""
    import torch
    from safetensors.torch import save

    blob = save({name: torch.empty(0, dtype=t.dtype) for name, t in tensors.items()})
    (n,) = struct.unpack("<Q", blob[:8])
    header = load_json(blob[8 : 8 + n])  # dicts keep the file's order
    header.pop("__metadata__", None)
    return list(header), {name: info["dtype"] for name, info in header.items()}


def _write_all(fd: int, data: bytes | memoryview, pos: int) -> None:
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], pos + done)


def _copy(src: int, dst: int, src_pos: int, dst_pos: int, n: int) -> None:
    """Copy ``n`` bytes from ``src`` at ``src_pos`` to ``dst`` at ``dst_pos``: in the kernel where it can,
    else through a buffer of ``COPY_BYTES``."""
    if kernel_copy(src, dst, src_pos, dst_pos, n):
        return
    done = 0
    while done < n:
        block = os.pread(src, min(COPY_BYTES, n - done), src_pos + done)
        if not block:
            raise OSError(errno.EIO, "the spool ended early while copying it")
        _write_all(dst, block, dst_pos + done)
        done += len(block)
