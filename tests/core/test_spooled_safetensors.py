"""The spooled safetensors writer writes, byte for byte, the file safetensors' save_file writes for the
same tensors, whatever order they are handed over in, and leaves no spool behind."""

from __future__ import annotations

import errno
import os

import pytest

import surgery.core.spooled_safetensors as spooled
from surgery.core.spooled_safetensors import SpooledSafetensors


def _tensors():
    """Names out of order, every dtype class safetensors orders (wide to narrow), a scalar, an empty
    tensor, a non-ASCII name and a view into a larger tensor."""
    import torch

    g = torch.Generator().manual_seed(0)
    big = torch.randn(8, 6, generator=g)
    out = {
        "model.layers.10.mlp.down_proj.weight": torch.randn(5, 7, generator=g),
        "model.layers.2.mlp.down_proj.weight": torch.randn(3, 4, generator=g).to(torch.bfloat16),
        "lm_head.weight": torch.randn(4, 3, generator=g).to(torch.float16),
        "a.scale": torch.tensor(1.5),
        "b.empty": torch.empty(0, 3),
        "c.codes": torch.randint(-8, 8, (2, 9), generator=g).to(torch.int8),
        "d.mask": torch.rand(3, 3, generator=g) > 0.5,
        "e.step": torch.tensor([7, 8], dtype=torch.int64),
        "f.packed": torch.randint(0, 2**31 - 1, (4, 2), generator=g, dtype=torch.int32),
        "g.rows_of_a_bigger_tensor": big[2:5],
        "ü.weight": torch.randn(2, generator=g),
    }
    if hasattr(torch, "float8_e4m3fn"):
        out["h.fp8"] = torch.randn(3, 5, generator=g).to(torch.float8_e4m3fn)
    return out


@pytest.mark.parametrize("metadata", [{"format": "pt"}, None])
def test_same_bytes_as_save_file(metadata, tmp_path):
    from safetensors.torch import save_file

    tensors = _tensors()
    save_file(tensors, tmp_path / "theirs.safetensors", metadata=metadata)
    ours = SpooledSafetensors(tmp_path / "spool")
    for name in reversed(list(tensors)):
        ours.add(name, tensors[name])
    ours.finish(tmp_path / "ours.safetensors", metadata)
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()
    assert not (tmp_path / "spool").exists()


def test_same_bytes_when_the_kernel_cannot_copy(tmp_path, monkeypatch):
    """Where copy_file_range is refused (another filesystem, an old kernel) the bytes go through a buffer."""
    from safetensors.torch import save_file

    def refuse(*args):
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(os, "copy_file_range", refuse, raising=False)
    monkeypatch.setattr(spooled, "COPY_BYTES", 5)  # several buffers per tensor
    tensors = _tensors()
    save_file(tensors, tmp_path / "theirs.safetensors", metadata={"format": "pt"})
    ours = SpooledSafetensors(tmp_path / "spool")
    for name, t in tensors.items():
        ours.add(name, t)
    ours.finish(tmp_path / "ours.safetensors", {"format": "pt"})
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()


def test_a_name_twice_is_refused_and_discard_removes_the_spool(tmp_path):
    import torch

    ours = SpooledSafetensors(tmp_path / "spool")
    ours.add("w", torch.ones(2))
    assert (tmp_path / "spool").stat().st_size == 8
    with pytest.raises(ValueError, match="w is already in spool"):
        ours.add("w", torch.ones(2))
    ours.discard()
    assert not (tmp_path / "spool").exists()
