"""``surgery inspect FILE.gguf`` reads the file as a bake does (header and config): it shows the
stored types and the file's size, and imports nothing (no float32 copy in the cache)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from surgery.gguf.header import read_gguf_header
from tests.support.cli import run_main
from tests.support.moe_gguf import EXPERTS, write_moe_gguf
from tests.support.typed_gguf import write_typed_gguf


def _cached_files(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache).parent) for p in cache.rglob("*") if p.is_file())


def test_inspect_shows_the_stored_types_and_imports_nothing(tmp_path, capsys):
    src = tmp_path / "src.gguf"
    write_typed_gguf(src, "Q4_K", types={"blk.0.ffn_down.weight": "Q6_K", "blk.1.attn_output.weight": "Q8_0"})
    cache = Path(os.environ["SURGERY_CACHE"])

    res = run_main(["inspect", src, "--json"], capsys)
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    header = read_gguf_header(src)
    assert info["dtypes"] == ["F32", "Q4_K", "Q6_K", "Q8_0"]  # as stored, not the import's F32
    assert info["bytes"] == src.stat().st_size and info["tensors"] == len(header.tensors) and info["shards"] == 1
    assert info["supported"] and info["layers"] == 2 and info["layer_prefix"] == "model.layers.N."
    # the config transformers derives from the metadata, as a bake caches it: no import
    assert _cached_files(cache) == ["gguf-configs"]

    table = run_main(["inspect", src], capsys)
    assert table.returncode == 0, table.stderr
    assert "F32, Q4_K, Q6_K, Q8_0" in table.stdout
    assert _cached_files(cache) == ["gguf-configs"]


def test_inspect_shows_a_moe_files_stacked_experts(tmp_path, capsys):
    src = tmp_path / "moe.gguf"
    write_moe_gguf(src, "Q8_0")
    res = run_main(["inspect", src, "--json"], capsys)
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["dtypes"] == ["F32", "Q8_0"] and info["bytes"] == src.stat().st_size
    assert info["experts"] == EXPERTS and info["expert_layout"] == "stacked 3-D"  # llama.cpp's ffn_*_exps
    assert _cached_files(Path(os.environ["SURGERY_CACHE"])) == ["gguf-configs"]
