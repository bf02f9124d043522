"""A recipe or findings file from another model: a note (or a refusal), and the output names the
checkpoint actually edited, never the recipe's base_model (a push would publish the wrong lineage)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from surgery.core.checkpoint import Checkpoint
from surgery.find.findings import model_identity
from surgery.model.loading import Source, same_model
from tests.support.cli import cli_env, error_line, run_cli, run_main

OTHER = "org/other-model"
SNAPSHOT = "0123456789abcdef0123456789abcdef01234567"


def _recipe(tmp_path: Path, base: str = OTHER, head: int = 1) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(f"version: 1\nbase_model: {base}\nedits:\n  - {{type: head, layer: 0, head: {head}, alpha: 2.0}}\n")
    return path


def _card(folder: Path) -> tuple[dict, str]:
    text = (folder / "README.md").read_text()
    return yaml.safe_load(text[4:text.index("\n---", 4)]), text


def _reproduce_recipe(text: str) -> dict:
    """The recipe YAML block of the card's "Reproduce or undo" section."""
    section = text[text.index("## Reproduce or undo"):]
    start = section.index("```yaml\n") + len("```yaml\n")
    return yaml.safe_load(section[start:section.index("\n```", start)])


def _hub_cache(src: Path, root: Path, repo: str = "org/tiny-llama") -> Path:
    """``src`` as the Hub cache's snapshot of ``repo``: MODEL=repo resolves to it offline."""
    entry = root / f"models--{repo.replace('/', '--')}"
    shutil.copytree(src, entry / "snapshots" / SNAPSHOT)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(SNAPSHOT)
    return root


def test_recipe_of_another_model_on_a_local_folder(tiny, tmp_path, capsys):
    model = tiny("llama")
    out = tmp_path / "baked"
    result = run_main(["apply", _recipe(tmp_path), "--model", model, "--out", out, "--no-verify", "--json"], capsys)
    assert result.returncode == 0, result.stderr
    err = " ".join(result.stderr.split())
    assert f"note: the recipe was written for {OTHER}, not {model}" in err
    summary = json.loads(result.stdout)
    assert any(OTHER in n for n in summary["notes"])
    prov = json.loads((out / "surgery.json").read_text())
    assert prov["recipe"]["base_model"] == str(model) and prov["recipe"]["notes"] == {"written_for": OTHER}
    meta, text = _card(out)
    assert "base_model" not in meta and "base_model_relation" not in meta  # was base_model: org/other-model
    assert _reproduce_recipe(text)["base_model"] == model.name  # the edited folder, by name: no local path on a card
    assert f"# {model.name} — edited with surgery" in text


def test_recipe_of_another_model_on_a_hub_model(tiny, tmp_path):
    cache = _hub_cache(tiny("llama"), tmp_path / "hub")
    out = tmp_path / "baked"
    result = run_cli(["apply", _recipe(tmp_path), "--model", "org/tiny-llama", "--out", out, "--no-verify"],
                     env=cli_env(HF_HUB_CACHE=str(cache)))
    assert result.returncode == 0, result.stderr
    assert f"note: the recipe was written for {OTHER}, not org/tiny-llama" in " ".join(result.stderr.split())
    meta, text = _card(out)
    assert meta["base_model"] == "org/tiny-llama" and meta["base_model_relation"] == "finetune"
    assert "`surgery apply recipe.yaml --model org/tiny-llama --out OUT`" in text
    assert _reproduce_recipe(text)["base_model"] == "org/tiny-llama"
    assert OTHER not in meta.values() and "This is **org/tiny-llama**" in text
    # the recipe written for this very model: no note
    result = run_cli(["apply", _recipe(tmp_path, "ORG/tiny-llama"), "--model", "org/tiny-llama", "--out",
                      tmp_path / "same", "--no-verify"], env=cli_env(HF_HUB_CACHE=str(cache)))
    assert result.returncode == 0 and "note:" not in result.stderr, result.stderr


def test_recipe_that_cannot_fit_says_whose_it_is(tiny, tmp_path, capsys):
    model = tiny("llama")
    line = error_line(run_main(["apply", _recipe(tmp_path, head=9), "--model", model, "--out", tmp_path / "o"], capsys))
    assert "num_attention_heads = 4" in line and f"the recipe was written for {OTHER}, not this model" in line
    assert not (tmp_path / "o").exists()


def test_same_model_compares_folders_ids_and_names(tmp_path):
    local = tmp_path / "SmolLM2-135M-Instruct"
    local.mkdir()
    (tmp_path / "link").symlink_to(local)
    snapshot = tmp_path / "models--Org--Name" / "snapshots" / SNAPSHOT
    snapshot.mkdir(parents=True)
    assert same_model(str(tmp_path / "link"), Source(local))                           # the same folder
    assert not same_model(str(tmp_path), Source(local))                                # another folder
    assert same_model("HuggingFaceTB/smollm2-135m-instruct", Source(local))           # a copy named after its repo
    assert same_model("/elsewhere/smollm2-135m-instruct", Source(local))               # a path of another machine
    assert not same_model("HuggingFaceTB/SmolLM2-360M", Source(local))
    assert same_model("org/name", Source(snapshot))                                    # a Hub-cache snapshot
    assert same_model("Org/Name", Source(snapshot, "Org/Name"))
    assert not same_model("other/Name", Source(snapshot, "Org/Name"))                  # two ids: the whole id


@pytest.mark.parametrize("command", ["amplify-heads", "prune-neurons"])
def test_findings_of_another_model_with_transfer_note_it(tiny, tmp_path, capsys, command):
    """Findings carry a fingerprint: another model's are refused, or noted and recorded with --transfer."""
    model = tiny("llama")
    identity = {**model_identity(Checkpoint(model)), "fingerprint": "0" * 64, "path": "/models/other"}
    if command == "amplify-heads":
        doc = {"kind": "heads", "discovery": {"heads": [{"layer": 0, "head": 1}]}, "selected_heads": [[0, 1]]}
        args = ["--alpha", "2", "--top", "1"]
        key = "heads_findings"
    else:
        from tests.support.cases import _neuron_scores

        doc = {"kind": "neurons", "scores": _neuron_scores(3, 48)}
        args = ["--n", "2"]
        key = "neuron_findings"
    path = tmp_path / "findings.json"
    path.write_text(json.dumps({"format": "surgery-findings", "version": 1, "model": identity, **doc}))
    base = [command, model, "--findings", path, *args, "--no-verify"]
    assert "--transfer" in error_line(run_main([*base, "--out", tmp_path / "a"], capsys))
    result = run_main([*base, "--transfer", "--out", tmp_path / "b"], capsys)
    assert result.returncode == 0, result.stderr
    assert "note: the findings were computed on another model (/models/other)" in " ".join(result.stderr.split())
    prov = json.loads((tmp_path / "b" / "surgery.json").read_text())
    assert prov[key]["transfer"] is True and prov[key]["model"] == "/models/other"


def test_transfer_without_findings_is_refused(tiny, tmp_path, capsys):
    model = tiny("llama")
    line = error_line(run_main(["amplify-heads", model, "--alpha", "2", "--transfer", "--out", tmp_path / "o"], capsys))
    assert "--transfer applies to --findings" in line
    line = error_line(run_main(["amplify-heads", model, "--heads", "0.1", "--alpha", "2", "--transfer",
                                "--out", tmp_path / "o"], capsys))
    assert "drop --findings / --top / --transfer" in line
