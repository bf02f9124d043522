"""export-lora with a recipe of another model: refused as apply refuses it (its α and n were chosen on
that model; the adapter's card says it reproduces "the recipe"), unless --allow-other-base, and then
the adapter records both names. A recipe of the model, or of the GGUF file it was imported from, exports."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import error_line, run_main

OTHER = "google/gemma-3-270m"


def _recipe(tmp_path: Path, base: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(f"version: 1\nbase_model: {base}\nedits:\n  - {{type: head, layer: 0, head: 1, alpha: 2.0}}\n")
    return path


def test_a_recipe_of_another_model_is_refused(tiny, tmp_path, capsys):
    """It was exported without a word (a Gemma recipe's heads fit SmolLM2's config)."""
    out = tmp_path / "adapter"
    line = error_line(
        run_main(["export-lora", tiny("llama"), "--recipe", _recipe(tmp_path, OTHER), "--out", out], capsys)
    )
    assert f"the recipe was written for {OTHER}" in line and "--allow-other-base to export it anyway" in line, line
    assert not out.exists()


def test_allow_other_base_exports_it_and_records_both_names(tiny, tmp_path, capsys):
    model, out = tiny("llama"), tmp_path / "adapter"
    args = ["export-lora", model, "--recipe", _recipe(tmp_path, OTHER), "--out", out, "--allow-other-base"]
    result = run_main(args, capsys)
    assert result.returncode == 0, result.stderr
    assert f"note: the recipe was written for {OTHER}" in " ".join(result.stderr.split())
    recipe = json.loads((out / "surgery_adapter.json").read_text())["recipe"]
    assert recipe["notes"] == {"written_for": OTHER} and recipe["base_model"] != OTHER


def test_a_recipe_of_the_gguf_file_a_folder_was_imported_from_exports(tiny, tmp_path, capsys):
    """docs/guides/gguf.md: export-lora takes a GGUF bake's recipe (its sidecar's, base_model the file's
    name) with the file's import as MODEL."""
    model = tiny("llama")
    (model / "surgery.gguf.json").write_text(json.dumps({"gguf": {"file": "Tiny-Model.Q4_1.gguf"}}))
    for base in ("Tiny-Model.Q4_1.gguf", "org/Tiny-Model"):
        out = tmp_path / f"adapter-{base.replace('/', '-')}"
        result = run_main(["export-lora", model, "--recipe", _recipe(tmp_path, base), "--out", out], capsys)
        assert result.returncode == 0, result.stderr


def test_a_quantized_model_is_refused_for_that_first(tmp_path, capsys):
    """No recipe exports from quantized weights: that is said before the recipe's model is compared
    (adding --allow-other-base would only lead to it)."""
    from tests.support.int_packed import build_int

    src, out = build_int(tmp_path / "src", "w4a16-g8"), tmp_path / "adapter"
    line = error_line(run_main(["export-lora", src, "--recipe", _recipe(tmp_path, OTHER), "--out", out], capsys))
    assert line.startswith("Error: export-lora writes an adapter from float weights"), line
