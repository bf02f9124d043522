"""The registry of stored formats: every registered format is detected on its fixture (and only there), plain
floats are the fallback, a format registers by subclassing, and a plain bake checks byte for byte."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch

from surgery.bake.bake import bake
from surgery.bake.check import edited_check
from surgery.core import stored_format
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import SurgeryError
from surgery.core.stored_format import StoredFormat
from surgery.formats.awq import Awq
from surgery.formats.fp8 import Fp8
from surgery.formats.int_packed import IntPacked
from surgery.formats.plain import PlainFloat
from tests.support.awq import build_awq
from tests.support.fp8 import build_fp8
from tests.support.int_packed import build_int
from tests.support.mxfp4 import build_mxfp4
from tests.support.nvfp4 import build_nvfp4

# Each registered format, on fixtures of its layouts (a new format adds its own here: the test below
# fails on a registered format without one).
FIXTURES = {
    "plain": [lambda folder, tiny: tiny("llama"), lambda folder, tiny: tiny("llama", torch.bfloat16)],
    "fp8": [lambda folder, tiny: build_fp8(folder, "block"), lambda folder, tiny: build_fp8(folder, "per-channel")],
    "int_packed": [
        lambda folder, tiny: build_int(folder, "w4a16-g8"),
        lambda folder, tiny: build_int(folder, "w8a16-channel"),
    ],
    "awq": [lambda folder, tiny: build_awq(folder), lambda folder, tiny: build_awq(folder, group=16)],
    "nvfp4": [
        lambda folder, tiny: build_nvfp4(folder),
        lambda folder, tiny: build_nvfp4(folder, head_dim=16),
    ],
    "mxfp4": [lambda folder, tiny: build_mxfp4(folder), lambda folder, tiny: build_mxfp4(folder, intermediate_size=96)],
}
# The weight each format's view exposes under its plain name (gpt-oss's MXFP4: a fused experts tensor)
VIEWED = {"mxfp4": "model.layers.0.mlp.experts.down_proj"}
CASES = [(name, k) for name, builders in FIXTURES.items() for k in range(len(builders))]


def test_the_built_in_formats_are_registered_in_detection_order():
    assert [cls.name for cls in stored_format.registered()] == list(FIXTURES)
    assert [cls for cls in stored_format.registered() if cls.fallback] == [PlainFloat]


@pytest.mark.parametrize(("name", "k"), CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_every_registered_format_is_detected_on_its_fixture(tmp_path, tiny, name, k):
    if name in ("int_packed", "awq", "nvfp4", "mxfp4"):
        pytest.importorskip("compressed_tensors")
    ckpt = Checkpoint(FIXTURES[name][k](tmp_path / "src", tiny))
    assert ckpt.format.name == name
    assert ckpt.quantized is (name != "plain")
    assert ckpt.format.view(ckpt).tensors.keys() >= {VIEWED.get(name, "model.layers.0.mlp.down_proj.weight")}


def test_plain_floats_are_the_fallback_and_the_text_config_is_read(tiny):
    src = tiny("llama")
    assert type(Checkpoint(src).format) is PlainFloat
    # a multimodal config may give its text model's quantization: it is read there too
    config = json.loads((src / "config.json").read_text())
    qconfig = {"quant_method": "fp8", "weight_block_size": [8, 8]}
    text = stored_format.detect([config, {**config, "quantization_config": qconfig}])
    assert isinstance(text, Fp8) and text.scheme.block == (8, 8)
    assert type(stored_format.detect([config, config])) is PlainFloat


def test_detection_reads_the_quantization_config_of_each_format():
    assert isinstance(stored_format.detect([{"quantization_config": {"quant_method": "fp8"}}]), Fp8)
    ct = {"quant_method": "compressed-tensors", "format": "pack-quantized"}
    ct["config_groups"] = {"g": {"weights": {"num_bits": 4, "strategy": "group", "group_size": 8, "type": "int"}}}
    found = stored_format.detect([{"quantization_config": ct}])
    assert type(found) is IntPacked and found.describe() == "int4 pack-quantized, group 8, symmetric"
    awq = stored_format.detect([{"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 32}}])
    assert type(awq) is Awq and awq.scheme.group_size == 32
    assert not stored_format.known({"quant_method": "bitsandbytes"})
    assert stored_format.refusal({"quant_method": "awq", "bits": 8}).startswith(
        "AutoAWQ weights that surgery cannot edit exactly: quantization_config.bits is 8"
    )
    assert stored_format.refusal({"quant_method": "gptq"}) is None


def test_a_subclass_with_a_name_registers_and_a_second_of_that_name_is_refused():
    class Probe(StoredFormat):  # no name: an intermediate, not registered
        @classmethod
        def detect(cls, qconfig: Any) -> None:
            return None

    assert Probe not in stored_format.registered()
    with pytest.raises(SurgeryError, match="two stored formats are named 'fp8'"):

        class Again(Probe):
            name = "fp8"

    assert stored_format.registered()[1] is Fp8


def test_the_refusal_of_an_unknown_quantization_offers_every_registered_format(tiny):
    src = tiny("llama")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes"}
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(SurgeryError) as exc:
        Checkpoint(src)
    assert str(exc.value).endswith(
        "use the unquantized (F32/F16/BF16), an FP8 e4m3, an int4 / int8 compressed-tensors, an int4 "
        "AutoAWQ GEMM, an NVFP4 compressed-tensors or a gpt-oss MXFP4 checkpoint"
    )


@pytest.mark.parametrize("recipe", [Recipe((HeadScale(1, 1, 0.5),)), Recipe((NeuronScale(0, 3, 0.0),))])
def test_a_plain_bake_checks_byte_for_byte_and_a_changed_byte_is_found(tmp_path, tiny, recipe):
    src = Checkpoint(tiny("llama"))
    bake(src, recipe, tmp_path / "out", check=edited_check(src, recipe))
    out = Checkpoint(tmp_path / "out")
    maps, problems = src.format.check(src, out, recipe)
    assert maps >= 1 and problems == []
    name = src.format.plan(src, recipe.validate(src.config), recipe.active())[0].info.name
    info = out.tensor(name)
    path = out.path / info.file
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:  # one byte of the edited tensor, changed
        f.seek(info.start)
        byte = f.read(1)
        f.seek(info.start)
        f.write(bytes([byte[0] ^ 0x40]))
    assert src.format.check(src, Checkpoint(out.path), recipe)[1] == [
        f"out: '{name}' does not hold the recipe's values"
    ]
