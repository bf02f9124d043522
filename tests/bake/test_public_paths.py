"""surgery.json (and a baked GGUF's sidecar) are published with the checkpoint: they name the source,
the findings and their cache files without any local path (issue 33, point 6)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import surgery
from surgery.bake.provenance import load_provenance, provenance_intact, sidecars
from surgery.bake.public import LOCAL_PATH
from surgery.bake.source_index import local_source_path
from surgery.core.cache import cache_dir
from surgery.ship.hub import check_pushable
from tests.support.binding import char_model
from tests.support.hub_cache import SNAPSHOT, hub_cache
from tests.support.neuron_pairs import write_pairs


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def assert_no_local_path(record_file: Path, *folders: Path) -> dict:
    """No value of the file is a local path, and no local folder appears anywhere in its text."""
    text = record_file.read_text(encoding="utf-8")
    data = json.loads(text)
    assert [s for s in _strings(data) if LOCAL_PATH.match(s)] == []
    for folder in (Path.home(), cache_dir(), *folders):
        assert str(folder) not in text, folder
    return data


def test_a_bake_from_cached_findings_records_no_local_path(tiny, tmp_path):
    """The reported case: prune-neurons with findings from the cache; surgery.json names the cache
    file, the model and the pairs by name, and push still checks the bake against its source."""
    model = char_model(tiny, "llama")
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    found = surgery.find_neurons(model, pairs=pairs, device="cpu")
    assert found.path.is_relative_to(cache_dir())
    out = tmp_path / "pruned"
    surgery.prune_neurons(model, out, n=2, pairs=pairs, device="cpu")
    data = assert_no_local_path(out / "surgery.json", tmp_path, Path(os.environ.get("TMPDIR", "/tmp")))
    findings = data["neuron_findings"]
    assert (findings["file"], findings["model"]) == (found.path.name, model.name)
    assert (
        findings["dataset"]["source"] == "pairs.jsonl" and findings["model_fingerprint"] == found.data.model.fingerprint
    )
    assert data["source"]["path"] == model.name and data["recipe"]["base_model"] == model.name
    assert provenance_intact(out)
    # the source is found on this machine by its fingerprint (never published): push compares with it
    record = load_provenance(out)
    assert local_source_path(record.source) == model.resolve()
    assert "structural check against the source" in check_pushable(out)[0]


def test_a_hub_model_is_recorded_by_its_id(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(hub_cache(tiny("llama"), tmp_path / "hub")))
    out = tmp_path / "amplified"
    surgery.amplify_heads("org/tiny-llama", out, heads="0.1", alpha=2.0)
    data = assert_no_local_path(out / "surgery.json", tmp_path)
    source = data["source"]
    assert (source["path"], source["hub_id"], source["revision"]) == ("org/tiny-llama", "org/tiny-llama", SNAPSHOT)
    assert data["recipe"]["base_model"] == "org/tiny-llama"


def test_a_baked_gguf_sidecar_records_no_local_path(tmp_path):
    from tests.support.tiny_gguf import gguf_source_model, write_tiny_gguf

    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, gguf_source_model())
    found = surgery.find_neurons(src, device="cpu")
    out = tmp_path / "pruned.gguf"
    surgery.prune_neurons(src, out, n=2, device="cpu")
    record_file, _ = sidecars(out)
    data = assert_no_local_path(record_file, tmp_path)
    assert data["neuron_findings"]["file"] == found.path.name and data["neuron_findings"]["model"] == "tiny.gguf"
    assert data["source"]["path"] == "tiny.gguf"
    assert local_source_path(load_provenance(out).source) == src.resolve()
