"""Containers: the registry, open_container's decisions and its refusal, and a safetensors folder and a
GGUF file through the same bake, sweep, verify and undo calls."""

from __future__ import annotations

import pytest

from surgery.api.bake_options import BakeOptions
from surgery.api.baked import Planned
from surgery.api.baking import bake_recipe, bake_sweep
from surgery.api.checkpoints import undo, verify
from surgery.bake.folder_container import FolderContainer
from surgery.bake.gguf_container import GgufContainer
from surgery.bake.provenance import load_provenance
from surgery.core import container as containers
from surgery.core.checkpoint import file_sha256
from surgery.core.container import Container, open_container
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import CheckpointError, DestinationError, ParameterError, SurgeryError
from tests.support.tiny import build_tiny
from tests.support.tiny_gguf import gguf_source_model, write_tiny_gguf

# α 2 and a pruned neuron: exact in a Q8_0 GGUF as in float32
EXACT = Recipe((HeadScale(0, 1, 2.0), NeuronScale(1, 3, 0.0)))
FAST = BakeOptions(verify=False)  # the bake's own check runs in tests/bake; here the pipeline is under test


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("containers")
    gguf = root / "tiny.gguf"
    write_tiny_gguf(gguf, gguf_source_model())
    return {"folder": build_tiny("llama", root / "llama"), "gguf": gguf}


def test_both_containers_are_registered_by_name():
    assert {"folder": FolderContainer, "gguf": GgufContainer}.items() <= {
        c.name: c for c in containers.registered()
    }.items()


def test_a_second_container_of_the_same_name_is_refused(monkeypatch):
    monkeypatch.setattr(containers, "_REGISTRY", dict(containers._REGISTRY))
    with pytest.raises(SurgeryError, match="two containers are named 'gguf'"):
        type("Other", (GgufContainer,), {"name": "gguf"})


def test_a_subclass_without_a_name_does_not_register(monkeypatch):
    monkeypatch.setattr(containers, "_REGISTRY", dict(containers._REGISTRY))
    before = containers.registered()
    type("Intermediate", (FolderContainer,), {})
    assert containers.registered() == before


def test_open_container_decides_by_the_path(tmp_path, sources):
    (tmp_path / "named.gguf").mkdir()  # a folder is a folder, whatever its name
    decided = {
        sources["folder"]: FolderContainer,
        sources["gguf"]: GgufContainer,
        tmp_path / "missing.gguf": GgufContainer,  # an output to come, or a missing file the reader names
        "org/name": FolderContainer,  # a Hub id
        tmp_path / "missing": FolderContainer,  # opening it says it does not exist
        tmp_path / "named.gguf": FolderContainer,
    }
    for path, cls in decided.items():
        opened = open_container(path)
        assert type(opened) is cls, path
        assert opened.given == str(path)


def test_a_file_no_container_holds_is_refused_in_one_line(tmp_path):
    stray = tmp_path / "weights.bin"
    stray.write_bytes(b"\0" * 8)
    with pytest.raises(CheckpointError) as caught:
        open_container(stray)
    message = str(caught.value)
    assert message == f"{stray} is a file; give the checkpoint folder that holds it or a .gguf file"
    assert "\n" not in message


def test_the_abstract_container_cannot_be_built(tmp_path):
    with pytest.raises(TypeError):
        Container(tmp_path)  # type: ignore[abstract]


@pytest.mark.parametrize("kind", ["folder", "gguf"])
def test_bake_verify_undo_are_one_path_for_both(tmp_path, sources, kind):
    src = sources[kind]
    suffix = ".gguf" if kind == "gguf" else ""
    out, restored = tmp_path / f"baked{suffix}", tmp_path / f"restored{suffix}"

    baked = bake_recipe(src, EXACT, out, bake=FAST)
    assert baked.out == out and baked.provenance.recipe.edits == EXACT.edits
    assert baked.tensors_edited > 0
    report = verify(src, out, structural_only=True)
    assert report.ok, report.problems

    written = undo(out, restored)
    if kind == "gguf":
        assert written == {restored.name: file_sha256(src)}
    else:
        assert written == {name: file_sha256(src / name) for name in written}
        assert "model.safetensors" in written


@pytest.mark.parametrize("kind", ["folder", "gguf"])
def test_a_sweep_names_its_outputs_by_the_container(tmp_path, sources, kind):
    plans = [Planned("alpha-2", EXACT), Planned("alpha-4", Recipe((HeadScale(0, 1, 4.0),)))]
    results = bake_sweep(sources[kind], plans, tmp_path / "sweep", bake=FAST)
    suffix = ".gguf" if kind == "gguf" else ""
    assert {label: b.out for label, b in results.items()} == {
        p.label: tmp_path / "sweep" / f"{p.label}{suffix}" for p in plans
    }
    assert all(b.out.exists() for b in results.values())


def test_a_gguf_sweep_into_a_gguf_name_is_refused_before_anything_is_written(tmp_path, sources):
    with pytest.raises(DestinationError, match="a sweep writes one .gguf per value"):
        bake_sweep(sources["gguf"], [Planned("a", EXACT), Planned("b", EXACT)], tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_requantize_is_refused_by_the_folder_container(tmp_path, sources):
    with pytest.raises(ParameterError, match="GGUF models only"):
        bake_recipe(sources["folder"], EXACT, tmp_path / "out", bake=BakeOptions(requantize=True))
    assert not (tmp_path / "out").exists()


def test_pushing_a_missing_gguf_says_what_a_push_takes(tmp_path):
    with pytest.raises(
        SurgeryError, match="missing.gguf does not exist; give a baked checkpoint or adapter folder, or a baked .gguf"
    ):
        open_container(tmp_path / "missing.gguf").check_pushable()


@pytest.mark.parametrize("kind", ["folder", "gguf"])
def test_each_container_renders_its_own_card_from_the_record(tmp_path, sources, kind):
    out = tmp_path / ("baked.gguf" if kind == "gguf" else "baked")
    baked = bake_recipe(sources[kind], EXACT, out, bake=FAST)
    container = open_container(out)
    card = container.card(baked.provenance)
    assert card.startswith("---\n") and "## What was edited" in card
    if kind == "folder":  # the card the bake wrote beside the weights, rendered again from surgery.json
        assert card == (out / "README.md").read_text(encoding="utf-8")
    else:  # no folder to write it into: rendered from the sidecar record, with the GGUF's blocks
        assert f"`{out.name}`" in card and "## GGUF blocks" in card


def test_the_weights_an_eval_result_names_come_from_the_bake_record(tmp_path, sources):
    out = bake_recipe(sources["folder"], EXACT, tmp_path / "baked", bake=FAST).out
    assert open_container(out).recorded_weights() == load_provenance(out).weight_hashes()
    assert open_container(sources["folder"]).recorded_weights() is None  # a source names no bake
    gguf = bake_recipe(sources["gguf"], EXACT, tmp_path / "baked.gguf", bake=FAST).out
    assert open_container(gguf).recorded_weights() is None  # its card takes no eval result


def test_a_gguf_file_where_a_folder_is_read_says_to_import_it(tmp_path):
    """eval reads a checkpoint folder: a .gguf is told to be imported, not "give the folder that holds
    it" (that folder is no checkpoint)."""
    from surgery.core.checkpoint import Checkpoint

    gguf = tmp_path / "model.Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(CheckpointError, match=rf"is a GGUF file, .*surgery import-gguf {gguf} --out DIR"):
        Checkpoint(gguf)
