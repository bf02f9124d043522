"""``--offload-folder DIR``: the run writes into a folder of its own inside DIR, removed with the model, on
failure and on Ctrl-C; DIR inside the checkpoint or a bake's output, or a file, is one line before anything is
written. A bake refuses a budget too small before it copies.

transformers re-saves into the offload folder the weights it converts as it loads (a mixture of experts'
fused expert tensors); the others it reads from the checkpoint's own files.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import transformers

from surgery.core.checkpoint import Checkpoint
from surgery.core.errors import CheckpointError
from surgery.model.loading import LoadSpec, load_model
from surgery.model.placement import largest_layer_bytes
from tests.support.binding import char_model
from tests.support.cli import main_code
from tests.support.neuron_pairs import write_pairs


def _offloaded(model: Path, folder: Path) -> LoadSpec:
    """Two decoder layers' worth of CPU memory: the rest of ``model`` goes to disk."""
    budget = 2 * largest_layer_bytes(Checkpoint(model).tensors, 4) + 4096
    return LoadSpec(device="cpu", device_map="auto", max_memory=f"cpu={budget}B", offload_folder=str(folder))


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def test_the_given_folder_is_left_as_it_was(tiny, tmp_path):
    model = tiny("mixtral", num_hidden_layers=4)
    folder = tmp_path / "offload"
    net = load_model(model, _offloaded(model, folder))
    assert "disk" in net.hf_device_map.values(), net.hf_device_map
    written = _files(folder)
    assert written, "transformers re-saved no expert tensor: this test checks nothing"
    assert {p.relative_to(folder).parts[0] for p in written} == {next(folder.iterdir()).name}  # one own folder
    del net
    gc.collect()
    assert list(folder.iterdir()) == []


def test_nothing_is_left_after_ctrl_c_while_loading(tiny, tmp_path, monkeypatch):
    model = tiny("mixtral", num_hidden_layers=4)
    folder = tmp_path / "offload"
    original = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def interrupted(klass, *args, **kwargs):
        original(klass, *args, **kwargs)  # the expert tensors are written
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(interrupted))
    with pytest.raises(KeyboardInterrupt):
        load_model(model, _offloaded(model, folder))
    assert _files(folder) == []


def test_two_models_in_one_folder_do_not_share_files(tiny, tmp_path):
    model = tiny("mixtral", num_hidden_layers=4)
    folder = tmp_path / "offload"
    first = load_model(model, _offloaded(model, folder))
    second = load_model(model, _offloaded(model, folder))
    assert len(list(folder.iterdir())) == 2
    del first
    gc.collect()
    assert len(list(folder.iterdir())) == 1 and _files(folder)  # the second model's weights are still there
    del second
    gc.collect()


@pytest.mark.parametrize("where", ["inside", "itself", "file"])
def test_a_bad_folder_is_one_line_and_nothing_is_written(tiny, tmp_path, capsys, where):
    model = char_model(tiny, "llama", num_hidden_layers=4)
    before = _files(model)
    (tmp_path / "a-file").write_text("not a folder")
    folder = {"inside": model / "offload", "itself": model, "file": tmp_path / "a-file"}[where]
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    capsys.readouterr()
    offload = ["--device-map", "auto", "--max-memory", _offloaded(model, folder).max_memory]
    code = main_code(["find-neurons", model, "--pairs", pairs, "--device", "cpu", *offload, "--offload-folder", folder])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("note:")]
    assert code == 2 and len(err) == 1 and err[0].startswith("Error: --offload-folder"), err
    assert _files(model) == before and not (model / "offload").exists()


def test_a_folder_that_cannot_be_made_is_one_line(tiny, tmp_path):
    model = tiny("llama")
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a parent folder should be")
    with pytest.raises(CheckpointError, match=r"^--offload-folder .*: cannot write there \(.*\); give a writable"):
        load_model(model, _offloaded(model, blocker / "offload"))


def test_a_folder_inside_the_bakes_output_is_one_line(tiny, tmp_path, capsys, monkeypatch):
    """The bake's run of the source made it there; the bake then found --out taken, after all its work."""
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache"))  # the source's run is not remembered
    model = tiny("llama", num_hidden_layers=4)
    out = tmp_path / "pruned"
    offload = ["--device-map", "auto", "--max-memory", _offloaded(model, out).max_memory]
    capsys.readouterr()
    code = main_code(
        ["prune-neurons", model, "--neurons", "0:3", "--out", out, "--device", "cpu", *offload, "--offload-folder", out]
    )
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("note:")]
    assert code == 2 and err[-1].startswith(f"Error: --offload-folder {out} is inside --out"), err
    assert not out.exists()


def test_a_budget_too_small_is_refused_before_the_bake_copies(tiny, tmp_path, capsys, monkeypatch):
    """The bake's run of its source starts with the copy: the budget was refused once the copy and the
    patching were done (minutes on a large model)."""
    import surgery.bake.bake as bake_module

    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache"))  # the source's run is not remembered
    model = tiny("llama", num_hidden_layers=4)
    copied: list[Path] = []
    monkeypatch.setattr(bake_module, "_patch_file", lambda source, *a, **k: copied.append(source))
    small = f"cpu={largest_layer_bytes(Checkpoint(model).tensors, 4) // 2}B"
    out = tmp_path / "pruned"
    capsys.readouterr()
    code = main_code(
        ["prune-neurons", model, "--neurons", "0:3", "--out", out, "--device", "cpu"]
        + ["--device-map", "auto", "--max-memory", small]
    )
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("note:")]
    assert code == 2 and len(err) == 1 and "one decoder layer needs" in err[0], err
    assert not copied and not out.exists()


@pytest.mark.parametrize("command", ["verify", "eval"])
def test_a_folder_inside_the_other_model_is_one_line(tiny, tmp_path, capsys, monkeypatch, command):
    """verify and eval load two models: the first load made the folder inside the second (verify: the
    baked output it only reads)."""
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache"))
    source = char_model(tiny, "llama", num_hidden_layers=4)
    baked = tmp_path / "pruned"
    assert main_code(["prune-neurons", source, "--neurons", "0:3", "--out", baked, "--device", "cpu"]) == 0
    before = _files(source) + _files(baked)
    inside = {"verify": baked, "eval": source}[command]
    args = {
        "verify": ["verify", source, baked],
        "eval": ["eval", baked, "--against", source, "--suite", "kl", "--limit", "1", "--recompute"],
    }[command]
    offload = ["--device", "cpu", "--device-map", "auto", "--max-memory", _offloaded(source, inside).max_memory]
    capsys.readouterr()
    code = main_code([*args, *offload, "--offload-folder", inside / "offload"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("note:")]
    assert code == 2 and len(err) == 1 and err[0].startswith("Error: --offload-folder"), err
    assert _files(source) + _files(baked) == before and not (inside / "offload").exists()
