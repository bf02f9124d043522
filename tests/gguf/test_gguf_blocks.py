"""The registry of GGUF block types: every built-in type is a gguf-py type registered in the order refusals
list them, a type registers by subclassing (a second of a name refused), and a block type made up in
this test alone is what a bake, its verify and its undo dispatch a tensor of that type to."""

from __future__ import annotations

import numpy as np
import pytest

from surgery.bake.gguf import bake_gguf
from surgery.bake.gguf_verify import undo_gguf, verify_gguf
from surgery.core.edits import Recipe, parse_neurons
from surgery.core.errors import RecipeError, SurgeryError
from surgery.gguf.blocks import (
    Edited,
    GgufBlockType,
    PartialEdit,
    base,
    block_type,
    registered,
    requantizable,
    supported,
)
from surgery.gguf.blocks.floats import FloatValues
from surgery.gguf.blocks.mxfp4 import MXFP4
from surgery.gguf.blocks.scaled import Q8_0, KQuantBlocks, ScaledBlocks
from surgery.gguf.model import open_gguf
from tests.support.typed_gguf import tensor_values, write_typed_gguf

gguf = pytest.importorskip("gguf")


def test_every_built_in_type_is_a_gguf_py_type_of_its_own_block_shape():
    names = supported()
    assert names[:3] == ("F32", "F16", "BF16") and names[-2:] == ("MXFP4", "NVFP4")
    assert len(set(names)) == len(names) == len(registered())
    for name in names:
        stored = block_type(name)
        qtype = gguf.GGMLQuantizationType[name]
        assert block_type(qtype).name == name  # the enum member finds the same type
        assert stored.block_shape == gguf.GGML_QUANT_SIZES[qtype]
        if isinstance(stored, ScaledBlocks):  # every scale field is an f16 inside one block
            assert all(0 <= at <= stored.block_shape[1] - 2 for at in stored.scale_fields)


def test_the_families_answer_what_an_edit_can_do():
    assert all(block_type(n).zeroes_values for n in ("F32", "F16", "BF16", "Q8_0", "MXFP4", "NVFP4"))
    assert not any(block_type(n).zeroes_values for n in ("Q4_0", "Q4_K", "IQ4_NL", "TQ2_0"))
    assert requantizable() == ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4")
    assert isinstance(block_type("Q8_0"), Q8_0) and isinstance(block_type("Q6_K"), KQuantBlocks)
    assert isinstance(block_type("BF16"), FloatValues) and isinstance(block_type("MXFP4"), MXFP4)
    with pytest.raises(RecipeError, match=r"^w is stored as IQ1_M, which surgery cannot edit .* MXFP4, NVFP4$"):
        block_type("IQ1_M", "w")


def test_a_subclass_with_a_name_registers_and_a_second_of_that_name_is_refused():
    class Probe(FloatValues):  # no name: an intermediate, not registered
        pass

    assert Probe not in registered()
    with pytest.raises(SurgeryError, match="two GGUF block types are named 'Q8_0'"):

        class Again(Probe):
            name = "Q8_0"

    assert type(block_type("Q8_0")) is Q8_0


@pytest.fixture
def own_registry(monkeypatch):
    """The block type registry as a copy, so that a type this test registers is gone after it."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))


def test_a_block_type_registered_in_a_test_is_dispatched_to(tmp_path, own_registry):
    """ggml's I8 (one int8 per value) is no type surgery edits; registered here, a pruned neuron's
    gate row stored as I8 goes through this class in the bake, its verify and its undo."""
    src, out = tmp_path / "src.gguf", tmp_path / "out.gguf"
    gate = "blk.0.ffn_gate.weight"
    write_typed_gguf(src, "Q8_0", types={gate: "I8"})
    recipe = Recipe(tuple(parse_neurons("0:3", 0.0)))
    with pytest.raises(RecipeError, match=r"blk\.0\.ffn_gate\.weight is stored as I8, which surgery cannot"):
        bake_gguf(open_gguf(src), recipe, tmp_path / "refused.gguf")

    edited: list[str] = []

    class Int8Values(GgufBlockType):
        """Integers as they are: a factor is exact when it leaves every value an int8."""

        name = "I8"
        zeroes_values = True

        def dequantize(self, blocks: np.ndarray) -> np.ndarray:
            return blocks.view(np.int8).astype(np.float32).reshape(len(blocks), -1)

        def edit(
            self, blocks: np.ndarray, factors: np.ndarray, tensor: str, requantize: bool, part: PartialEdit
        ) -> Edited:
            edited.append(tensor)
            want = self.dequantize(blocks) * factors
            if not ((want == np.round(want)) & (np.abs(want) <= 127)).all():
                raise RecipeError(f"{tensor} (I8): the factor leaves a value that is no int8")
            return Edited(want.astype(np.int8).view(np.uint8))

    assert "I8" in supported() and isinstance(block_type("I8"), Int8Values)
    before = tensor_values(src, gate)
    result = bake_gguf(open_gguf(src), recipe, out)
    assert edited == [gate]
    assert gate in {e.tensor for e in result.provenance.edited_tensors}
    after = tensor_values(out, gate)
    want = before.copy()
    want[3] = 0
    assert np.array_equal(after, want) and before[3].any()
    assert verify_gguf(out, src).ok and edited == [gate, gate]  # verify recomputed the blocks through it
    undo_gguf(out, tmp_path / "restored.gguf")
    assert (tmp_path / "restored.gguf").read_bytes() == src.read_bytes()
