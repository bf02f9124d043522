"""The MXFP4 bake's check decodes only the edited blocks (by a table of transformers' decoder):
it still catches a wrong value inside an edited block and any changed byte elsewhere in an edited expert."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from surgery.bake.bake import bake
from surgery.bake.check import edited_check
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import NeuronScale, Recipe
from surgery.formats.mxfp4.plan import dequantized_problems, weights_of
from surgery.formats.mxfp4.storage import decode_blocks
from tests.support.mxfp4 import build_mxfp4

pytest.importorskip("compressed_tensors")

# expert 2 of layer 1: neuron 3 pruned (gate/up lines 6, 7; down input 3), the down inputs 32..63 halved
RECIPE = Recipe((NeuronScale(1, 3, 0.0, 2), *(NeuronScale(1, n, 0.5, 2) for n in range(32, 64))))


@pytest.fixture(scope="module")
def baked(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mx")
    src = build_mxfp4(tmp / "src")
    ckpt = Checkpoint(src)
    bake(ckpt, RECIPE, tmp / "out", check=edited_check(ckpt, RECIPE))
    return src, tmp / "out"


def _flip(out, tmp_path, name: str, index: int, mask: int):
    """A copy of ``out`` with byte ``index`` of tensor ``name`` xor ``mask``."""
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    info = Checkpoint(bad).tensors[name]
    with open(bad / info.file, "r+b") as f:
        f.seek(info.start + index)
        byte = f.read(1)[0]
        f.seek(info.start + index)
        f.write(bytes([byte ^ mask]))
    return Checkpoint(bad)


def test_the_baked_output_passes(baked):
    src, out = baked
    maps, problems = dequantized_problems(Checkpoint(src), Checkpoint(out), RECIPE)
    assert maps > 0 and problems == []


def _byte(w, kind: str, expert: int, line: int, block: int, byte: int = 0) -> tuple[str, int]:
    """(tensor, byte index) of ``expert``'s output ``line``'s ``block``: its code ``byte``, or its scale."""
    _, out, groups, half = w.codes.shape
    if kind == "scale":
        return w.scale.name, (expert * out + line) * groups + block
    return w.codes.name, ((expert * out + line) * groups + block) * half + byte


@pytest.mark.parametrize(
    "tensor, kind, line, block, byte, mask",
    [
        ("down_proj", "code", 5, 0, 1, 0x10),  # input 3 (pruned: high nibble of byte 1) no longer +0
        ("down_proj", "scale", 5, 1, 0, 0x01),  # inputs 32..63 (halved): another E8M0 scale
        ("gate_up_proj", "code", 10, 0, 2, 0x01),  # line 10: not edited
        ("gate_up_proj", "scale", 11, 0, 0, 0x01),
    ],
    ids=["edited code", "edited scale", "code outside", "scale outside"],
)
def test_a_changed_byte_of_an_edited_expert_is_caught(baked, tmp_path, tensor, kind, line, block, byte, mask):
    src, out = baked
    w = weights_of(Checkpoint(src))[f"model.layers.1.mlp.experts.{tensor}"]
    name, index = _byte(w, kind, 2, line, block, byte)
    _, problems = dequantized_problems(Checkpoint(src), _flip(out, tmp_path, name, index, mask), RECIPE)
    assert problems and "expert 2" in problems[0] and tensor in problems[0], problems


def test_blocks_decode_as_the_whole_tensor():
    """decode_blocks (any blocks, by the table) gives the values of transformers' whole-tensor decode, at
    every E8M0 scale (255, NaN, included)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (3, 256, 4, 16), dtype=np.uint8)
    scales = np.broadcast_to(np.arange(256, dtype=np.uint8)[None, :, None], (3, 256, 4)).copy()
    whole = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    got = decode_blocks(blocks.reshape(-1, 16), scales.reshape(-1))  # [expert · out · block, 32]
    want = whole.numpy().transpose(0, 2, 1).reshape(3, 256, 4, 32).reshape(-1, 32)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # bit for bit, NaNs and signs included


def test_the_decoder_table_is_cached_checked_and_remade(monkeypatch, tmp_path):
    """The table is written once per decoder (transformers' MXFP4 source and torch's version), named by its
    sha256; a damaged copy is not used: the table is made again by transformers."""
    from surgery.formats.mxfp4 import storage

    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path))
    storage.decoder_values.cache_clear()
    first = storage.decoder_values().copy()
    (path,) = (tmp_path / "mxfp4").glob("decoder-*.bin")
    storage.decoder_values.cache_clear()
    monkeypatch.setattr(storage, "pair_values", lambda: pytest.fail("the cached table was not used"))
    assert np.array_equal(storage.decoder_values().view(np.uint32), first.view(np.uint32))
    damaged = bytearray(path.read_bytes())
    damaged[12345] ^= 1
    path.write_bytes(bytes(damaged))
    storage.decoder_values.cache_clear()
    monkeypatch.undo()
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path))
    assert np.array_equal(storage.decoder_values().view(np.uint32), first.view(np.uint32))
    storage.decoder_values.cache_clear()


def test_the_decoder_table_is_keyed_by_the_decoders_source(monkeypatch, tmp_path):
    """A transformers whose MXFP4 decoder changed under the same version string (a patched or editable
    install) does not reuse the table of the other one: the key is its source file's hash."""
    from surgery.formats.mxfp4 import storage

    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path))
    key = storage._decoder_key()
    assert key is not None and len(key) == 16
    storage.decoder_values.cache_clear()
    storage.decoder_values()
    assert [p.name.split("-")[1] for p in (tmp_path / "mxfp4").glob("*.bin")] == [key]
    monkeypatch.setattr(storage, "_decoder_key", lambda: "0" * 16)
    tabulated = []
    real = storage.pair_values
    monkeypatch.setattr(storage, "pair_values", lambda: tabulated.append(1) or real())
    storage.decoder_values.cache_clear()
    storage.decoder_values()
    assert tabulated == [1]  # another decoder's table was not read
    assert sorted(p.name.split("-")[1] for p in (tmp_path / "mxfp4").glob("*.bin")) == sorted([key, "0" * 16])
    storage.decoder_values.cache_clear()
