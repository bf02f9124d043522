"""GGUF MXFP4 blocks (type 39: one E8M0 exponent and 32 e2m1 codes): a power of two shifts the exponent,
a pruned down column is its 4-bit codes set to +0 (the other nibble of each byte kept), anything else is
refused in one line or, with ``--requantize``, rounded once by gguf-py with its error recorded. The whole
bake (prune, heads α 2 and 0.5) is tests/gguf/test_gguf_bake.py's, parametrized over every supported type."""

from __future__ import annotations

import numpy as np
import pytest

from surgery.bake.gguf import bake_gguf
from surgery.bake.gguf_verify import undo_gguf, verify_gguf
from surgery.core.edits import HeadScale, Recipe
from surgery.core.errors import RecipeError
from surgery.gguf.blocks import block_type
from surgery.gguf.model import open_gguf
from tests.support.typed_gguf import random_blocks, write_typed_gguf


def _blocks(n: int = 8) -> np.ndarray:
    return random_blocks("MXFP4", n, 32, np.random.default_rng(0))


def test_a_pruned_value_keeps_the_other_nibble_and_a_power_of_two_shifts_the_exponent():
    blocks = _blocks()
    factors = np.ones((8, 32), np.float32)
    factors[0, [3, 20]] = 0.0  # value 3: byte 1 + 3's low nibble; value 20: byte 1 + 4's high nibble
    factors[1] = 0.0  # a whole block
    factors[2] = 4.0
    mxfp4 = block_type("MXFP4")
    edited = mxfp4.edit(blocks, factors, "t", requantize=False)
    before, after = mxfp4.dequantize(blocks), mxfp4.dequantize(edited.blocks)
    assert np.array_equal(after, before * factors) and edited.requantized == 0
    assert edited.blocks[0, 4] == blocks[0, 4] & 0xF0 and edited.blocks[0, 5] == blocks[0, 5] & 0x0F
    assert not edited.blocks[1, 1:].any() and edited.blocks[1, 0] == blocks[1, 0]  # codes +0, exponent kept
    assert edited.blocks[2, 0] == blocks[2, 0] + 2 and np.array_equal(edited.blocks[2, 1:], blocks[2, 1:])
    untouched = np.ones(8, bool)
    untouched[:3] = False
    assert np.array_equal(edited.blocks[untouched], blocks[untouched])


# 0.75 is no power of two; 2^-126 would take the exponents (118..123) below 0
@pytest.mark.parametrize(
    ("factor", "why"), [(0.75, "not exact"), (2.0**-126, "not exact")], ids=["not-pow2", "below-0"]
)
def test_an_inexact_factor_is_refused_in_one_line(factor, why):
    factors = np.full((8, 32), factor, np.float32)
    with pytest.raises(RecipeError) as err:
        block_type("MXFP4").edit(_blocks(), factors, "blk.0.attn_output.weight", requantize=False)
    msg = str(err.value)
    assert "\n" not in msg and "MXFP4" in msg and why in msg and "--requantize" in msg


def test_an_inexact_head_is_requantized_by_gguf_py_with_its_error_recorded(tmp_path):
    src, out = tmp_path / "src.gguf", tmp_path / "out.gguf"
    write_typed_gguf(src, "MXFP4", heads=4, head_dim=64)
    recipe = Recipe((HeadScale(1, 2, 0.7),))
    with pytest.raises(RecipeError, match=r"blk\.1\.attn_output\.weight \(MXFP4\): the factor .* --requantize"):
        bake_gguf(open_gguf(src), recipe, tmp_path / "refused.gguf")
    assert not (tmp_path / "refused.gguf").exists()
    result = bake_gguf(open_gguf(src), recipe, out, requantize=True)
    (row,) = result.provenance.extra["gguf"]["tensors"]
    assert row["requantized_blocks"] > 0 and 0 < row["max_abs_error"] < 0.1
    assert verify_gguf(out, src).ok
    undo_gguf(out, tmp_path / "restored.gguf")
    assert (tmp_path / "restored.gguf").read_bytes() == src.read_bytes()
