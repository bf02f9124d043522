"""Baking into GGUF files: for every supported type, dequantize(edited file) equals the edit applied
to dequantize(source), exactly; every other byte (metadata, untouched tensors) is the source's;
verify passes and catches a changed byte; undo gives the source byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

from surgery.bake.gguf import bake_gguf
from surgery.bake.gguf_verify import undo_gguf, verify_gguf
from surgery.core.checkpoint import file_sha256
from surgery.core.edits import HeadScale, Recipe, parse_neurons
from surgery.gguf.blocks import block_type, supported
from surgery.gguf.blocks.floats import FloatValues
from surgery.gguf.header import tensor_bytes
from surgery.gguf.model import open_gguf
from tests.support.typed_gguf import tensor_values, write_typed_gguf

NEURONS = "0:5,0:300,1:511"
HEADS = ((0, 1, 2.0), (1, 0, 0.5))  # (layer, head, α): powers of two, exact in every type
HEAD_DIM = 256


def recipe() -> Recipe:
    return Recipe(tuple(parse_neurons(NEURONS, 0.0)) + tuple(HeadScale(la, h, a) for la, h, a in HEADS))


def expected_edit(values: dict[str, np.ndarray], kind: str) -> dict[str, np.ndarray]:
    """The recipe applied to dequantized source tensors, written out by hand from what the edits mean."""
    out = {k: v.copy() for k, v in values.items()}
    stored = block_type(kind)
    for label in NEURONS.split(","):
        layer, n = map(int, label.split(":"))
        out[f"blk.{layer}.ffn_gate.weight"][n, :] = 0
        out[f"blk.{layer}.ffn_up.weight"][n, :] = 0
        if stored.zeroes_values:  # a single value zeroes exactly only there
            out[f"blk.{layer}.ffn_down.weight"][:, n] = 0
    for layer, head, alpha in HEADS:
        out[f"blk.{layer}.attn_output.weight"][:, head * HEAD_DIM : (head + 1) * HEAD_DIM] *= np.float32(alpha)
    if isinstance(stored, FloatValues):  # float types round each value to the stored type, as a safetensors bake does
        out = {k: stored.dequantize(stored.quantize(v)).reshape(v.shape) for k, v in out.items()}
    return out


EDITED = [f"blk.{la}.{t}.weight" for la in (0, 1) for t in ("attn_output", "ffn_gate", "ffn_up", "ffn_down")]


@pytest.mark.parametrize("kind", supported())
def test_bake_is_exact_and_touches_nothing_else(tmp_path, kind):
    src, out = tmp_path / f"src-{kind}.gguf", tmp_path / "out.gguf"
    write_typed_gguf(src, kind, head_dim=HEAD_DIM)
    result = bake_gguf(open_gguf(src), recipe(), out)

    before = {n: tensor_values(src, n) for n in EDITED}
    want = expected_edit(before, kind)
    for name in EDITED:
        got = tensor_values(out, name)
        assert np.array_equal(got, want[name]), name
    assert not np.array_equal(want["blk.0.ffn_gate.weight"], before["blk.0.ffn_gate.weight"])  # not vacuous

    # Every byte outside the edited blocks is the source's: header (metadata), untouched tensors, gaps.
    a, b = src.read_bytes(), out.read_bytes()
    assert len(a) == len(b)
    header = open_gguf(src).header
    first = min(t.offset for t in header.tensors.values())
    assert a[:first] == b[:first]
    edited = {e.tensor for e in result.provenance.edited_tensors}
    for t in header.tensors.values():
        span = slice(t.offset, t.offset + tensor_bytes(t))
        assert (a[span] == b[span]) == (t.name not in edited), t.name
    assert edited <= set(EDITED)

    assert verify_gguf(out, src).ok
    restored = tmp_path / "restored.gguf"
    undo_gguf(out, restored)
    assert restored.read_bytes() == a


def test_verify_catches_a_changed_byte_and_undo_refuses(tmp_path):
    src, out = tmp_path / "src.gguf", tmp_path / "out.gguf"
    write_typed_gguf(src, "Q4_K", head_dim=HEAD_DIM)
    result = bake_gguf(open_gguf(src), recipe(), out)
    t = open_gguf(out).header.tensors[result.provenance.edited_tensors[0].tensor]
    with open(out, "r+b") as f:
        f.seek(t.offset + 1)
        byte = f.read(1)
        f.seek(t.offset + 1)
        f.write(bytes([byte[0] ^ 0x10]))
    report = verify_gguf(out, src)
    assert not report.ok and "changed after the bake" in report.problems[0]
    from surgery.core.errors import VerificationError

    with pytest.raises(VerificationError, match="changed after the bake"):
        undo_gguf(out, tmp_path / "restored.gguf")
    assert not (tmp_path / "restored.gguf").exists()


def test_a_changed_undo_sidecar_is_a_verify_failure_and_undo_says_so(tmp_path):
    """A byte changed in NAME.gguf.surgery.undo stopped verify with an error (the sidecar "is corrupt
    (…): re-download or re-save it; cannot undo") before its recorded sha256 was compared: verify now
    reports it changed after the bake (exit 1), and undo says to put the sidecar back."""
    from surgery.bake.provenance import sidecars
    from surgery.core.errors import VerificationError

    src, out = tmp_path / "src.gguf", tmp_path / "out.gguf"
    write_typed_gguf(src, "Q8_0", head_dim=HEAD_DIM)
    bake_gguf(open_gguf(src), recipe(), out)
    undo = sidecars(out)[1]
    data = bytearray(undo.read_bytes())
    data[100] ^= 0x01  # in the sidecar's header: no longer parses
    undo.write_bytes(bytes(data))
    report = verify_gguf(out, src)
    assert report.problems == [f"{undo.name} changed after the bake (sha256 differs from the record)"], report.problems
    with pytest.raises(VerificationError, match="changed after the bake .*; put back the sidecar the bake wrote"):
        undo_gguf(out, tmp_path / "restored.gguf")
    assert not (tmp_path / "restored.gguf").exists()


def test_verify_recomputes_the_blocks(tmp_path):
    """A bake whose record and hashes were re-made to match wrong bytes still fails: the blocks are
    recomputed from the originals and the recipe."""
    import json

    from surgery.bake.provenance import provenance_text, sidecars

    src, out = tmp_path / "src.gguf", tmp_path / "out.gguf"
    write_typed_gguf(src, "Q8_0", head_dim=HEAD_DIM)
    bake_gguf(open_gguf(src), Recipe((HeadScale(0, 1, 2.0),)), out)
    t = open_gguf(out).header.tensors["blk.0.attn_output.weight"]
    with open(out, "r+b") as f:  # the head's first block: its d goes back to the source's d × 4
        f.seek(t.offset + HEAD_DIM // 32 * 34)
        d = np.frombuffer(f.read(2), np.float16) * np.float16(2)
        f.seek(t.offset + HEAD_DIM // 32 * 34)
        f.write(d.astype(np.float16).tobytes())
    record_path = sidecars(out)[0]
    record = json.loads(record_path.read_text())
    record["files"]["out.gguf"] = file_sha256(out)
    record_path.write_text(provenance_text(record))
    report = verify_gguf(out, src)
    assert not report.ok
    assert any("differs from what the recipe prescribes" in p or "is not the source" in p for p in report.problems)
