"""Checks shared by the tests of weights held as stored (NVFP4, compressed-tensors integers): what a
model holds against its file, and a model held as stored computing what the 16-bit hold computes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from surgery.core.checkpoint import Checkpoint


def held_bytes(model) -> int:
    """What the model holds: its parameters' and buffers' storages, each once (tied tables share one)."""
    storages = [t.untyped_storage() for t in (*model.parameters(), *model.buffers())]
    return sum({s.data_ptr(): s.nbytes() for s in storages}.values())


def file_bytes(folder: Path) -> int:
    """The checkpoint's weights as stored: every tensor's bytes."""
    return sum(info.nbytes for info in Checkpoint(folder).tensors.values())


def assert_packed_computes_as_sixteen(packed, sixteen, src: Path, batch: Mapping[str, torch.Tensor]) -> None:
    """``packed`` (held as stored) holds at most 1.5× the file of ``src``, less than ``sixteen`` (the
    16-bit hold), counts as the same weights, and computes every weight and the logits, with and without
    run-time edits, bit for bit as ``sixteen`` does."""
    from surgery.model.hooks import applied, model_architecture
    from surgery.model.upcast import computed_value
    from surgery.model.widening import weight_count
    from tests.support.coverage import proof_edits

    assert held_bytes(packed) <= 1.5 * file_bytes(src) < held_bytes(sixteen)
    # a weight held as bytes still counts as its weights (find-heads' FLOPs)
    assert weight_count(packed) == weight_count(sixteen) == sum(p.numel() for p in sixteen.parameters())
    modules = {name: dict(m.named_modules()) for name, m in (("packed", packed), ("16", sixteen))}
    for name, _ in sixteen.named_parameters():
        owner, _, leaf = name.rpartition(".")
        assert torch.equal(computed_value(modules["packed"][owner], leaf), computed_value(modules["16"][owner], leaf))
    edits = [e for group in proof_edits(model_architecture(sixteen)).values() for e in group]
    with torch.no_grad():
        assert torch.equal(packed(**batch).logits, sixteen(**batch).logits)
        with applied(packed, edits):
            got = packed(**batch).logits
        with applied(sixteen, edits):
            want = sixteen(**batch).logits
    assert torch.equal(got, want)


def assert_held_computes_as_dequantized(held, plain, batch: Mapping[str, torch.Tensor]) -> None:
    """``held`` (weights held as stored) computes every weight exactly as ``plain`` (the checkpoint
    dequantized whole) holds it, and the same logits, with and without run-time edits, up to summation
    order (tests.support.models.assert_same_function): the run-time twins see the decoded weights."""
    from surgery.model.hooks import applied, model_architecture
    from surgery.model.upcast import computed_value
    from tests.support.coverage import proof_edits
    from tests.support.models import assert_same_function

    modules = dict(held.named_modules())
    for name, value in plain.named_parameters():
        owner, _, leaf = name.rpartition(".")
        assert torch.equal(computed_value(modules[owner], leaf), value), name  # what PPM reads
    edits = [e for group in proof_edits(model_architecture(plain)).values() for e in group]
    with torch.no_grad():
        assert_same_function(held(**batch).logits, plain(**batch).logits, plain)
        with applied(plain, edits):
            want = plain(**batch).logits
        with applied(held, edits):
            got = held(**batch).logits
    assert_same_function(got, want, plain)
