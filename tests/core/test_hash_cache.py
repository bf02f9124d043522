"""Source hashes remembered across bakes by file state: taken only while the file is unchanged."""

from __future__ import annotations

import pytest

import surgery.bake.bake as bake_module
import surgery.core.hash_cache as hash_cache
from surgery.bake.bake import bake
from surgery.bake.verify import verify
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import HeadScale, Recipe

RECIPE = Recipe((HeadScale(0, 1, 2.5),))


@pytest.fixture
def settled(monkeypatch):
    """Files written before a bake starts count as settled (the tests do not wait 2 s)."""
    monkeypatch.setattr(hash_cache, "SETTLE_SECONDS", 0.0)


def _hashed(monkeypatch) -> list[str]:
    seen: list[str] = []
    real = bake_module.file_sha256
    monkeypatch.setattr(bake_module, "file_sha256", lambda path, *a: seen.append(path.name) or real(path, *a))
    return seen


def test_second_bake_takes_source_hashes_from_the_cache(tiny, tmp_path, monkeypatch, settled):
    src = tiny("llama", shard="20KB")
    first = bake(Checkpoint(src), RECIPE, tmp_path / "a").provenance.to_dict()
    assert first["hashing"]["source_files_from_hash_cache"] == []
    seen = _hashed(monkeypatch)
    second = bake(Checkpoint(src), RECIPE, tmp_path / "b").provenance.to_dict()
    assert seen == ["surgery.undo"]  # no source file read back for hashing
    assert second["hashing"]["source_files_from_hash_cache"] == sorted(p.name for p in src.iterdir())
    assert second["source_files"] == first["source_files"] == {p.name: file_sha256(p) for p in src.iterdir()}
    assert second["files"] == first["files"]
    assert verify(Checkpoint(src), tmp_path / "b", run_model=False).ok


def test_a_changed_source_file_is_hashed_again(tiny, tmp_path, settled):
    src = tiny("llama", shard="20KB")
    bake(Checkpoint(src), RECIPE, tmp_path / "a")
    config = src / "config.json"
    config.write_text(config.read_text() + "\n")  # same settings, other bytes
    prov = bake(Checkpoint(src), RECIPE, tmp_path / "b").provenance.to_dict()
    assert "config.json" not in prov["hashing"]["source_files_from_hash_cache"]
    assert "model.safetensors.index.json" in prov["hashing"]["source_files_from_hash_cache"]
    assert prov["source_files"]["config.json"] == file_sha256(config)


def test_fresh_files_are_not_remembered(tiny, tmp_path):
    """A file written within SETTLE_SECONDS of the hash could change again in the same clock tick."""
    src = tiny("llama", shard="20KB")  # just written
    bake(Checkpoint(src), RECIPE, tmp_path / "a")
    prov = bake(Checkpoint(src), RECIPE, tmp_path / "b").provenance.to_dict()
    assert prov["hashing"]["source_files_from_hash_cache"] == []


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"x": 3}'])
def test_a_corrupt_cache_is_ignored(tiny, tmp_path, monkeypatch, settled, content):
    cache = tmp_path / "cache"
    monkeypatch.setenv("SURGERY_CACHE", str(cache))
    cache.mkdir()
    (cache / hash_cache.CACHE_NAME).write_text(content)
    src = tiny("llama", shard="20KB")
    prov = bake(Checkpoint(src), RECIPE, tmp_path / "a").provenance.to_dict()
    assert prov["source_files"] == {p.name: file_sha256(p) for p in src.iterdir()}
    assert bake(Checkpoint(src), RECIPE, tmp_path / "b").provenance.hashing.source_files_from_hash_cache
