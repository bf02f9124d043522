"""A GGUF file is named after its model with the quantization added (SmolLM2-135M-Instruct.Q4_1.gguf):
a recipe written for that model (``base_model: HuggingFaceTB/SmolLM2-135M-Instruct``, as recipes/ has
them) bakes into it without --allow-other-base, and a recipe of another model is still refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from surgery.core.errors import CheckpointError
from surgery.gguf.file_name import model_name
from surgery.model.loading import Source, same_model
from tests.support.cli import error_line, run_main
from tests.support.typed_gguf import write_typed_gguf


@pytest.mark.parametrize(
    ("file", "model"),
    [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct"),  # the quickstart's file
        ("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m"),  # a file type's label, lower case
        ("Llama-3.1-8B-Instruct-Q4_K_M-00001-of-00002.gguf", "Llama-3.1-8B-Instruct"),  # a shard
        ("gpt-oss-20b-MXFP4.gguf", "gpt-oss-20b"),  # a tensor type's label
        ("model.gguf", "model"),  # no label
        ("Qwen2.5-0.5B.gguf", "Qwen2.5-0.5B"),  # a dot that is no label's
    ],
)
def test_model_name_drops_the_quantization_label(file, model):
    assert model_name(Path(file)) == model


def test_a_gguf_file_is_the_model_it_is_named_after(tmp_path):
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert same_model("HuggingFaceTB/SmolLM2-135M-Instruct", Source(gguf))
    assert same_model("smollm2-135m-instruct", Source(gguf))
    assert not same_model("HuggingFaceTB/SmolLM2-360M-Instruct", Source(gguf))
    assert not same_model("google/gemma-3-270m", Source(gguf))


def _recipe(tmp_path: Path, base: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(f"version: 1\nbase_model: {base}\nedits:\n  - {{type: head, layer: 0, head: 1, alpha: 2.0}}\n")
    return path


def test_apply_bakes_a_recipe_of_the_model_a_gguf_is_named_after(tmp_path, capsys):
    """It was refused as "written for org/tiny-model, not …/tiny-model.Q8_0.gguf" (every ready recipe
    on the quickstart's GGUF)."""
    src = tmp_path / "tiny-model.Q8_0.gguf"
    write_typed_gguf(src, "Q8_0")
    out = tmp_path / "baked.gguf"
    result = run_main(["apply", _recipe(tmp_path, "org/tiny-model"), "--model", src, "--out", out], capsys)
    assert result.returncode == 0, result.stderr
    assert "written for" not in result.stderr and out.is_file()

    other = tmp_path / "other.gguf"
    line = error_line(run_main(["apply", _recipe(tmp_path, "org/other-model"), "--model", src, "--out", other], capsys))
    assert "the recipe was written for org/other-model" in line and "--allow-other-base" in line, line
    assert not other.exists()


def test_an_import_is_the_model_of_the_gguf_file_it_records(tmp_path):
    """surgery import-gguf's folder holds that file's weights: a recipe of the file (a GGUF bake's
    sidecar names it) or of its model is the import's, by name or by the file's path."""
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    folder = tmp_path / "imported.gguf"  # a folder, named so before import-gguf refused such an --out
    folder.mkdir()
    (folder / "surgery.gguf.json").write_text(json.dumps({"gguf": {"file": gguf.name}}))
    for named in (gguf.name, str(gguf), "HuggingFaceTB/SmolLM2-135M-Instruct"):
        assert same_model(named, Source(folder)), named
    assert not same_model("google/gemma-3-270m", Source(folder))
    assert not same_model(str(gguf), Source(tmp_path / "elsewhere"))


def test_an_import_record_that_is_not_one_is_one_line(tmp_path):
    (tmp_path / "surgery.gguf.json").write_text("{")
    with pytest.raises(CheckpointError, match="is not the record surgery import-gguf writes; import the file again"):
        same_model("org/model", Source(tmp_path))
