"""An AutoAWQ checkpoint moved to compressed-tensors with compressed-tensors' own converter
(``convert_checkpoint`` + ``AutoAWQConverter``, as docs/guides/quantized.md tells AutoAWQ users to do now
that AutoAWQ is deprecated) is an int4 pack-quantized checkpoint surgery bakes exactly: the converted
weights decode to the AWQ file's values, and a pruned neuron bakes and verifies."""

from __future__ import annotations

import numpy as np
import pytest

from surgery.bake.bake import bake
from surgery.bake.check import edited_check
from surgery.bake.verify import verify
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import NeuronScale, Recipe
from surgery.formats.int_packed.plan import weight_values, weights_of
from tests.support.awq import build_awq

pytest.importorskip("compressed_tensors")

DOWN = "model.layers.1.mlp.down_proj.weight"


def test_a_converted_autoawq_checkpoint_bakes_as_compressed_tensors(tmp_path):
    from compressed_tensors.entrypoints.convert import AutoAWQConverter, convert_checkpoint

    src = build_awq(tmp_path / "awq")
    converted = tmp_path / "ct"
    convert_checkpoint(
        str(src), str(converted), AutoAWQConverter.from_pretrained(str(src)), max_workers=1, device="cpu"
    )
    ckpt, awq = Checkpoint(converted), Checkpoint(src)
    assert ckpt.format.name == "int_packed" and ckpt.format.scheme.format == "pack-quantized"
    before = weights_of(awq)
    for name, w in weights_of(ckpt).items():  # the AWQ file's values, as surgery's AWQ format decodes them
        assert np.array_equal(weight_values(ckpt, w), weight_values(awq, before[name])), name
    recipe = Recipe((NeuronScale(1, 3, 0.0),))
    out = tmp_path / "out"
    bake(ckpt, recipe, out, check=edited_check(ckpt, recipe))
    baked = Checkpoint(out)
    down = weight_values(baked, weights_of(baked)[DOWN])
    assert not down[:, 3].any() and down[:, 4].any()
    report = verify(ckpt, out)
    assert report.ok, report.problems
