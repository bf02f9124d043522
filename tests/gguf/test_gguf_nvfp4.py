"""GGUF NVFP4 blocks (type 40: 64 e2m1 codes and four unsigned e4m3 scales, one per group of 16): a factor
on whole groups goes through their scales when the product is an e4m3 value, a pruned value is its 4-bit
code set to +0 (the other nibble of its byte kept), and anything else is refused in one line, even with
``--requantize`` (gguf-py cannot encode NVFP4). The whole bake (prune, heads α 2 and 0.5) is
tests/gguf/test_gguf_bake.py's, parametrized over every supported type; llama.cpp running the baked
files is tests/gguf/test_llamacpp.py's."""

from __future__ import annotations

import numpy as np
import pytest

from surgery.bake.gguf import bake_gguf
from surgery.core.edits import HeadScale, Recipe
from surgery.core.errors import RecipeError
from surgery.gguf.blocks import block_type
from surgery.gguf.model import open_gguf
from tests.support.typed_gguf import random_blocks, write_typed_gguf

pytest.importorskip("gguf")


def _blocks(n: int = 8) -> np.ndarray:
    return random_blocks("NVFP4", n, 64, np.random.default_rng(0))


def test_a_pruned_value_keeps_the_other_nibble_and_a_group_factor_goes_through_its_scale():
    nvfp4, blocks = block_type("NVFP4"), _blocks()
    factors = np.ones((8, 64), np.float32)
    factors[0, [3, 16 + 12]] = 0.0  # group 0 value 3: byte 4 + 3 low; group 1 value 12: byte 12 + 4 high
    factors[1] = 0.0  # a whole block
    factors[2, 16:32] = 2.0  # one group doubled
    factors[3, :16] = 0.5  # one group halved
    edited = nvfp4.edit(blocks, factors, "t", requantize=False)
    before, after = nvfp4.dequantize(blocks), nvfp4.dequantize(edited.blocks)
    assert np.array_equal(after, before * factors) and edited.requantized == 0
    assert edited.blocks[0, 7] == blocks[0, 7] & 0xF0 and edited.blocks[0, 16] == blocks[0, 16] & 0x0F
    assert not edited.blocks[1, 4:].any() and np.array_equal(edited.blocks[1, :4], blocks[1, :4])  # codes +0
    assert edited.blocks[2, 1] == blocks[2, 1] + 8 and np.array_equal(edited.blocks[2, 4:], blocks[2, 4:])
    assert edited.blocks[3, 0] == blocks[3, 0] - 8  # the e4m3 exponent one lower
    assert np.array_equal(edited.blocks[4:], blocks[4:])


@pytest.mark.parametrize("requantize", [False, True])
@pytest.mark.parametrize(
    ("part", "why"),
    [(slice(0, 16), "not an e4m3 value"), (slice(0, 8), "part of a group of 16")],
    ids=["whole-group", "half-group"],
)
def test_an_inexact_factor_is_refused_in_one_line_even_with_requantize(part, why, requantize):
    factors = np.ones((8, 64), np.float32)
    factors[0, part] = 0.7
    with pytest.raises(RecipeError) as err:
        block_type("NVFP4").edit(_blocks(), factors, "blk.0.attn_output.weight", requantize=requantize)
    msg = str(err.value)
    assert "\n" not in msg and "(NVFP4)" in msg and why in msg and "cannot requantize NVFP4" in msg


def test_a_scale_pushed_past_e4m3s_largest_value_is_refused():
    blocks = _blocks()
    blocks[0, 0] = 0x7E  # 448, e4m3's largest
    factors = np.ones((8, 64), np.float32)
    factors[0, :16] = 2.0
    with pytest.raises(RecipeError, match="not an e4m3 value"):
        block_type("NVFP4").edit(blocks, factors, "t", requantize=False)


def test_an_inexact_head_refuses_the_bake_and_writes_nothing(tmp_path):
    src = tmp_path / "src.gguf"
    write_typed_gguf(src, "NVFP4", heads=4, head_dim=64)
    with pytest.raises(RecipeError, match=r"blk\.1\.attn_output\.weight \(NVFP4\): the factor .* e4m3"):
        bake_gguf(open_gguf(src), Recipe((HeadScale(1, 2, 0.7),)), tmp_path / "refused.gguf", requantize=True)
    assert not (tmp_path / "refused.gguf").exists()
