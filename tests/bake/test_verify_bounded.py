"""verify loads the source once and swaps in the edited tensors, also under accelerate disk offload."""

from __future__ import annotations

import pytest
import torch

import surgery.model.loading
from surgery.bake.bake import bake
from surgery.bake.verify import numeric, verify
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import HeadScale, NeuronScale, Recipe

# Layer 0 stays in memory, layers 1 and 2 go to disk with max_memory 80KB (see _offloaded).
RECIPE = Recipe((HeadScale(0, 1, 2.5), NeuronScale(1, 3, 0.0), HeadScale(2, 0, 0.5)))


def _offloaded(path, folder):
    """The source as a user loads a model larger than memory (accelerate's big-model loading)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, device_map="auto", max_memory={"cpu": "80KB"}, offload_folder=folder
    ).eval()


def _logits(model):
    ids = torch.randint(3, 90, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        return model(input_ids=ids).logits


@pytest.fixture
def baked(tiny, tmp_path):
    src = tiny("llama")
    bake(Checkpoint(src), RECIPE, tmp_path / "baked")
    return src, tmp_path / "baked"


def test_verify_loads_the_source_once(baked, monkeypatch):
    src, out = baked
    loads = []
    real = surgery.model.loading.load_model
    monkeypatch.setattr(surgery.model.loading, "load_model", lambda *a, **k: loads.append(a[0]) or real(*a, **k))
    report = verify(Checkpoint(src), out)
    assert report.ok and report.max_abs_logit_diff <= 1e-5
    assert [str(p) for p in loads] == [str(src)]


def test_verify_on_a_disk_offloaded_model(baked, tmp_path):
    src, out = baked
    model = _offloaded(src, tmp_path / "offload")
    assert set(model.hf_device_map.values()) == {"cpu", "disk"}
    assert model.get_parameter("model.layers.0.self_attn.o_proj.weight").device.type == "cpu"
    assert model.get_parameter("model.layers.2.self_attn.o_proj.weight").device.type == "meta"
    before = _logits(model)
    offloaded = verify(Checkpoint(src), out, model=model)
    plain = verify(Checkpoint(src), out)
    assert offloaded.ok and plain.ok
    assert offloaded.max_abs_logit_diff <= 1e-5 and abs(offloaded.max_abs_logit_diff - plain.max_abs_logit_diff) <= 1e-5
    assert torch.equal(_logits(model), before)  # the swapped tensors are back: the model is the source again


@pytest.mark.parametrize(
    "edit",
    [HeadScale(0, 2, 2.5), HeadScale(2, 1, 0.5), NeuronScale(1, 4, 0.0)],
    ids=["in-memory-layer", "offloaded-layer", "offloaded-neuron"],
)
def test_offloaded_numeric_catches_a_wrong_slice(tiny, tmp_path, edit):
    src = tiny("llama")
    wrong = Recipe(tuple(edit if type(e) is type(edit) and e.layer == edit.layer else e for e in RECIPE.edits))
    assert wrong != RECIPE
    bake(Checkpoint(src), wrong, tmp_path / "wrong")  # baked from another recipe, checked against RECIPE
    diff, tol = numeric(Checkpoint(src), tmp_path / "wrong", RECIPE, model=_offloaded(src, tmp_path / "offload"))
    assert diff > 100 * tol.value


def test_verify_with_the_load_options_for_big_models(baked, tmp_path, monkeypatch):
    """The same through the command's load options: load_model places the source with accelerate."""
    from surgery.model.loading import LoadSpec

    src, out = baked
    models = []
    real = surgery.model.loading.load_model
    monkeypatch.setattr(surgery.model.loading, "load_model", lambda *a, **k: models.append(real(*a, **k)) or models[-1])
    load = LoadSpec(
        device="cpu",
        dtype="float32",
        device_map="auto",
        max_memory="cpu=80KB",
        offload_folder=str(tmp_path / "offload"),
    )
    report = verify(Checkpoint(src), out, load=load)
    assert report.ok and report.max_abs_logit_diff <= 1e-5
    assert len(models) == 1 and "disk" in models[0].hf_device_map.values()  # weights really were on disk


def test_verify_in_bfloat16_allows_bfloat16_rounding(tiny, tmp_path):
    """float32 weights run in bfloat16 (--dtype bfloat16): the tolerance follows the compute dtype."""
    from surgery.model.loading import LoadSpec

    src = tiny("llama")  # float32 on disk
    bake(Checkpoint(src), RECIPE, tmp_path / "baked")
    report = verify(Checkpoint(src), tmp_path / "baked", load=LoadSpec(device="cpu", dtype="bfloat16"))
    assert report.ok and report.tolerance_basis.dtype == "BF16"
    in_float32 = verify(Checkpoint(src), tmp_path / "baked")
    assert in_float32.ok and in_float32.tolerance_basis.dtype == "F32"
    # the same logits' size and depth, bfloat16's unit roundoff 2⁻⁸ for float32's 2⁻²⁴
    assert report.tolerance / report.tolerance_basis.max_abs_logit == pytest.approx(
        2.0**16 * in_float32.tolerance / in_float32.tolerance_basis.max_abs_logit
    )


def test_a_quantized_source_is_freed_and_its_heap_returned_before_the_baked_model_loads(tmp_path, monkeypatch):
    """Held codes (NVFP4 here) are compared by loading the baked model too: the source is gone, and its
    C heap pages returned (core/freed_memory.py), before it loads, or the command holds both models."""
    import weakref

    import surgery.core.freed_memory
    from tests.support.cli import main_code
    from tests.support.nvfp4 import build_nvfp4

    src = build_nvfp4(tmp_path / "src", "llama")
    out = tmp_path / "out"
    assert main_code(["prune-neurons", str(src), "--neurons", "0:3", "--no-verify", "--out", str(out)]) == 0
    events, models = [], []
    load, freed = surgery.model.loading.load_model, surgery.core.freed_memory.return_freed_memory

    def loading(path, *args, **kwargs):
        events.append(("load", path.name, [ref() is None for ref in models]))
        model = load(path, *args, **kwargs)
        models.append(weakref.ref(model))
        return model

    def returning():
        freed()
        events.append(("returned", [ref() is None for ref in models]))

    monkeypatch.setattr(surgery.model.loading, "load_model", loading)
    monkeypatch.setattr(surgery.core.freed_memory, "return_freed_memory", returning)
    report = verify(Checkpoint(src), out)
    assert report.ok, report.problems
    assert events == [("load", "src", []), ("returned", [True]), ("load", "out", [True])]
