"""--device / --dtype / --device-map / --max-memory / --offload-folder: accelerate's placement, our checks.

The findings of a model split across CPU memory and disk offload equal the plain model's: the
capture hooks, the registered attention function and the run-time twins all run under accelerate's
dispatch hooks. Bad placement input is one line before any model is loaded.
"""

from __future__ import annotations

import gc
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from surgery.core.edits import HeadScale, NeuronScale
from surgery.core.errors import CheckpointError
from surgery.find.heads.find import find_heads
from surgery.find.heads.params import FindParams
from surgery.find.neurons.find import find_neurons
from surgery.find.neurons.pairs import load_pairs
from surgery.model.hooks import applied
from surgery.model.loading import Checkpoint, LoadSpec, compute_dtype, load_model
from surgery.model.placement import largest_layer_bytes, parse_max_memory, parse_size, resolve_dtype
from tests.support.binding import char_model, write_small_benchmark
from tests.support.cli import main_code
from tests.support.neuron_pairs import write_pairs


def _offloading(model: Path, tmp_path: Path) -> LoadSpec:
    """CPU memory for about two decoder layers: accelerate puts the rest on disk."""
    layer = largest_layer_bytes(Checkpoint(model).tensors, 4)
    return LoadSpec(
        device="cpu", device_map="auto", max_memory=f"cpu={2 * layer + 4096}B", offload_folder=str(tmp_path / "offload")
    )


def _where(model) -> set[str]:
    return {str(v) for v in model.hf_device_map.values()}


@pytest.fixture
def deep(tiny):
    """Six layers, so that some sit in CPU memory and the others on disk."""
    return char_model(tiny, "llama", num_hidden_layers=6)


def test_disk_offload_really_offloads_and_the_twins_run_through_it(deep, tmp_path):
    spec = _offloading(deep, tmp_path)
    plain, split = load_model(deep, LoadSpec(device="cpu")), load_model(deep, spec)
    assert {"cpu", "disk"} <= _where(split), split.hf_device_map
    ids = torch.tensor([[5, 9, 14, 3, 22, 7]])
    edits = [HeadScale(layer=5, head=1, alpha=2.5), NeuronScale(layer=4, neuron=3, factor=0.0)]
    with torch.inference_mode():
        with applied(plain, edits):
            want = plain(input_ids=ids).logits
        with applied(split, edits):
            got = split(input_ids=ids).logits
        base = split(input_ids=ids).logits
    assert (want - base).abs().max() > 1e-3  # the edits change something
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_offloaded_model_gives_the_same_neuron_findings(deep, tmp_path, monkeypatch):
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache"))
    pairs = load_pairs(write_pairs(tmp_path / "pairs.jsonl"))
    from surgery.core.checkpoint import Checkpoint as Ckpt

    plain = find_neurons(Ckpt(deep), pairs, load=LoadSpec(device="cpu"), recompute=True)
    split = find_neurons(Ckpt(deep), pairs, load=_offloading(deep, tmp_path), recompute=True)
    assert split.data.compute.device_map == "accelerate"
    np.testing.assert_allclose(split.scores.ppm, plain.scores.ppm, rtol=1e-6)
    for name in ("bias", "signed", "activation"):
        a, b = getattr(plain.scores, name), getattr(split.scores, name)
        assert a.keys() == b.keys()
        for category in a:
            np.testing.assert_allclose(b[category], a[category], rtol=1e-5, atol=1e-7, err_msg=name)
    assert plain.select(8, _select()).neurons == split.select(8, _select()).neurons


@pytest.mark.parametrize("arch", ["qwen2_moe", "gpt_oss"])
def test_offloaded_moe_gives_the_same_expert_findings(tiny, tmp_path, monkeypatch, arch):
    """Everything on disk, the embeddings too: the input ids go to a real device (not the first
    parameter's "meta"), and the capture and PPM read the experts' weights brought in from disk."""
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache"))
    model = char_model(tiny, arch)
    pairs = load_pairs(write_pairs(tmp_path / "pairs.jsonl"))
    layer = largest_layer_bytes(Checkpoint(model).tensors, 4)
    spec = LoadSpec(
        device="cpu", device_map="auto", max_memory=f"cpu={layer + 4096}B", offload_folder=str(tmp_path / "offload")
    )
    assert set(load_model(model, spec).hf_device_map.values()) == {"disk"}
    plain = find_neurons(Checkpoint(model), pairs, load=LoadSpec(device="cpu"), recompute=True)
    split = find_neurons(Checkpoint(model), pairs, load=spec, recompute=True)
    assert plain.scores.experts is not None
    np.testing.assert_array_equal(split.scores.ppm, plain.scores.ppm)
    for name in ("bias", "signed", "activation", "reached"):
        a, b = getattr(plain.scores, name), getattr(split.scores, name)
        for category in a:
            np.testing.assert_allclose(b[category], a[category], rtol=1e-5, atol=1e-7, err_msg=name)
    assert plain.select(8, _select()).neurons == split.select(8, _select()).neurons


def _select():
    from surgery.find.neurons.params import SelectParams

    return SelectParams()


def test_offloaded_model_gives_the_same_head_findings(deep, tmp_path):
    from surgery.find.heads.benchmark import load_benchmark
    from surgery.find.heads.pairs import build_pairs

    pairs = build_pairs(load_benchmark(write_small_benchmark(tmp_path / "small.jsonl")), seed=0, max_pairs=6)
    params = FindParams(max_pairs=6, random_sets=1, confirm=0, knockout_heads=2)
    plain = find_heads(deep, pairs, params, load=LoadSpec(device="cpu")).to_dict()
    split = find_heads(deep, pairs, params, load=_offloading(deep, tmp_path)).to_dict()
    assert plain["selected_heads"] == split["selected_heads"]
    # S is a difference of log-probabilities of order 1: float32 noise of the offloaded run is ~1e-7
    np.testing.assert_allclose(split["scores"]["S"]["delta"], plain["scores"]["S"]["delta"], rtol=0, atol=1e-6)
    # K: the knowledge probe's passes share each batch's prefix cache, here across CPU and disk layers
    np.testing.assert_allclose(split["scores"]["K"]["delta"], plain["scores"]["K"]["delta"], rtol=0, atol=1e-6)
    assert [h["coef"] for h in split["discovery"]["heads"]] == pytest.approx(
        [h["coef"] for h in plain["discovery"]["heads"]], rel=1e-4, abs=1e-5
    )


def test_bfloat16_findings_are_their_own_cache_entry(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache"))
    model = char_model(tiny, "llama")
    pairs = load_pairs(write_pairs(tmp_path / "pairs.jsonl"))
    from surgery.core.checkpoint import Checkpoint as Ckpt

    f32 = find_neurons(Ckpt(model), pairs, load=LoadSpec(device="cpu"))
    bf16 = find_neurons(Ckpt(model), pairs, load=LoadSpec(device="cpu", dtype="bfloat16"))
    assert f32.data.compute.dtype == "float32" and bf16.data.compute.dtype == "bfloat16"
    assert f32.path != bf16.path and not bf16.from_cache
    # bf16 rounds the activations, the float32 sums keep the ranking close
    top = set(f32.select(10, _select()).neurons) & set(bf16.select(10, _select()).neurons)
    assert len(top) >= 6


def test_auto_dtype_is_float32_on_the_cpu():
    assert compute_dtype(LoadSpec(device="cpu")) == torch.float32
    assert compute_dtype(LoadSpec()) == (
        torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    )


def test_bfloat16_on_a_gpu_without_it_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla T4")
    with pytest.raises(CheckpointError, match="does not support bfloat16"):
        resolve_dtype("bfloat16", "cuda:0")
    assert resolve_dtype("auto", "cuda:0") == torch.float32


@pytest.mark.parametrize(
    "text, want",
    [
        ("0=70GiB,cpu=100GiB", {0: 70 * 2**30, "cpu": 100 * 2**30}),
        ("cuda:1=500MB, disk=1TB", {1: 500 * 10**6, "disk": 10**12}),
        ("cpu=123456", {"cpu": 123456}),
    ],
)
def test_max_memory_parses(text, want):
    assert parse_max_memory(text) == want


@pytest.mark.parametrize("text", ["cpu", "gpu=1GB", "cpu=lots", "=5GB", ","])
def test_bad_max_memory_is_refused(text):
    with pytest.raises(CheckpointError, match="--max-memory"):
        parse_max_memory(text)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("cpu=1GiB,cpu=2GiB", "names cpu twice ('cpu=1GiB' and 'cpu=2GiB')"),  # was: the last one, silently
        ("0=1GB,cuda:0=2GB", "names GPU 0 twice ('0=1GB' and 'cuda:0=2GB')"),
        ("CPU=1GB, cpu=2GB", "names cpu twice"),
        ("cpu=-1", "'-1' is not a size"),  # was: a negative budget
        ("cpu=inf", "'inf' is not a size"),  # was: an internal OverflowError
        ("cpu=nan", "'nan' is not a size"),
    ],
)
def test_repeated_devices_and_impossible_sizes_are_refused(text, needle):
    with pytest.raises(CheckpointError) as caught:
        parse_max_memory(text)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_a_gpu_this_machine_lacks_is_one_line_before_loading(tiny, tmp_path, capsys, monkeypatch):
    """The first GPU index this machine does not have (0 without a GPU): accelerate's placement
    failed with an internal "Cannot access accelerator device" error."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where our offload folder would go
    model = char_model(tiny, "llama")
    missing = torch.cuda.device_count() if torch.cuda.is_available() else 0
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    loads = []
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", lambda *a, **k: loads.append(a))
    capsys.readouterr()  # the fixture's own output (save_pretrained's progress bar)
    code = main_code(
        [
            "find-neurons",
            model,
            "--pairs",
            pairs,
            "--device",
            "cpu",
            "--device-map",
            "auto",
            "--max-memory",
            f"{missing}=1GiB,cpu=1GiB",
        ]
    )
    err = [
        line for line in capsys.readouterr().err.strip().splitlines() if line.strip() and not line.startswith("note:")
    ]
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"Error: --max-memory gives GPU {missing} a budget, but this machine has"), err
    assert not loads and not list(tmp_path.glob("surgery-offload-*"))


def test_sizes():
    assert parse_size("1.5KiB") == 1536 and parse_size("2 GB") == 2 * 10**9 and parse_size("1e3") == 1000
    assert parse_size("8G") == parse_size("8GiB") == 8 * 2**30  # a bare prefix is binary, as 8G of RAM


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--device-map", "auto", "--max-memory", "cpu=2KB"], "one decoder layer needs"),
        (["--max-memory", "cpu=1GB"], "--device-map auto"),
        (["--offload-folder", "x"], "--device-map auto"),
        (["--device-map", "auto", "--max-memory", "cpu:1GB"], "is not DEVICE=SIZE"),
        (["--dtype", "float64"], "--dtype"),
    ],
)
def test_bad_placement_is_one_line(tiny, tmp_path, capsys, extra, message):
    model = char_model(tiny, "llama")
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    capsys.readouterr()  # the fixture's own output (save_pretrained's progress bar, unless an earlier load hid it)
    code = main_code(["find-neurons", model, "--pairs", pairs, "--device", "cpu", *extra])
    err = [
        line for line in capsys.readouterr().err.strip().splitlines() if line.strip() and not line.startswith("note:")
    ]
    assert code == 2 and message in err[-1], err
    if message != "--dtype":  # click's own usage error for an unknown choice has its usage lines
        assert len(err) == 1, err
    assert not list(tmp_path.glob("surgery-offload-*"))


def test_the_cli_runs_offloaded_and_bfloat16(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where our offload folder goes
    model = char_model(tiny, "llama", num_hidden_layers=6)
    layer = largest_layer_bytes(Checkpoint(model).tensors, 2)
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    code = main_code(
        [
            "find-neurons",
            model,
            "--pairs",
            pairs,
            "--device",
            "cpu",
            "--dtype",
            "bfloat16",
            "--device-map",
            "auto",
            "--max-memory",
            f"cpu={2 * layer + 4096}",
            "--json",
        ]
    )
    assert code == 0, capsys.readouterr().err
    printed = json.loads(capsys.readouterr().out)
    assert printed["compute"] == {"dtype": "bfloat16", "device": "cpu", "device_map": "accelerate"}
    assert len(printed["summary"]["neurons"]) == 40
    gc.collect()  # the model is gone: so is our temporary offload folder
    assert not list(tmp_path.glob("surgery-offload-*"))
