"""export-lora from a GGUF file: adapter_config.json names the Hub repo the file's metadata says it was
converted from, so PEFT finds its base; a file that names none keeps its path there, and the command
says in one line that the base must be given. surgery_adapter.json records the file as its source
either way (export-lora checks lineage against it)."""

from __future__ import annotations

import json

import pytest

from surgery.gguf.hub_origin import hub_origin
from tests.support.cli import run_main
from tests.support.tiny_gguf import gguf_source_model, write_tiny_gguf

REPO = "tiny-org/Tiny-Llama"


def _export(tmp_path, capsys, strings: dict[str, str]):
    src = tmp_path / "Tiny-Llama.F32.gguf"
    write_tiny_gguf(src, gguf_source_model(), strings=strings)
    (tmp_path / "recipe.yaml").write_text("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: 2}\n")
    out = tmp_path / "adapter"
    result = run_main(["export-lora", src, "--recipe", tmp_path / "recipe.yaml", "--out", out], capsys)
    assert result.returncode == 0, result.stderr
    config = json.loads((out / "adapter_config.json").read_text())
    record = json.loads((out / "surgery_adapter.json").read_text())
    assert record["source"]["path"] == str(src) and record["source"]["hub_id"] is None
    return src, config["base_model_name_or_path"], " ".join(result.stderr.split())


def test_a_gguf_naming_its_hub_repo_gives_the_adapter_that_base(tmp_path, capsys):
    _, base, err = _export(tmp_path, capsys, {"general.source.url": f"https://huggingface.co/{REPO}"})
    assert base == REPO  # was the .gguf path: AutoPeftModelForCausalLM could not load it
    assert "PEFT cannot load" not in err, err


def test_a_gguf_naming_no_hub_repo_keeps_its_path_and_says_so(tmp_path, capsys):
    # the model it was fine-tuned from is other weights: not the adapter's base
    src, base, err = _export(tmp_path, capsys, {"general.base_model.0.repo_url": f"https://huggingface.co/{REPO}"})
    assert base == str(src)
    assert f"adapter_config.json names {src.name} as the base model (its metadata names no Hub repo)" in err, err
    assert f"surgery import-gguf {src.name} --out DIR" in err, err


@pytest.mark.parametrize(
    "metadata, repo",
    [
        ({"general.source.repo_url": f"https://huggingface.co/{REPO}/"}, REPO),
        ({"general.source.url": "https://example.org/paper", "general.source.repo_url": f"https://hf.co/{REPO}"}, REPO),
        ({"general.source.huggingface.repository": REPO}, REPO),
        ({"general.source.url": REPO}, None),  # a URL key holding no URL: a path, maybe
        ({"general.source.url": f"https://huggingface.co/datasets/{REPO}"}, None),
        ({"general.source.url": f"https://huggingface.co/{REPO}/tree/main"}, None),
        ({"general.name": "Tiny Llama", "general.base_model.0.repo_url": f"https://huggingface.co/{REPO}"}, None),
    ],
)
def test_the_hub_origin_is_the_files_own_source_repo(metadata, repo):
    assert hub_origin(metadata) == repo
