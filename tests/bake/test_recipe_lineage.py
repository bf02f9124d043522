"""A recipe or findings file from another model: a refusal unless allowed (--allow-other-base,
--transfer), and then the output names the checkpoint actually edited as its base, never the recipe's
base_model (a push would publish the wrong lineage), and keeps the recipe's model as written_for.
Where a checkpoint came from: a Hub download or a Hub-cache snapshot folder records its repo and the
commit read; --revision with a local folder is refused (it would be ignored)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from surgery.core.checkpoint import Checkpoint
from surgery.find.findings import model_identity
from surgery.model.loading import Source, same_model
from tests.support.cli import error_line, run_here, run_main
from tests.support.hub_cache import SNAPSHOT, hub_cache

OTHER = "org/other-model"


def _recipe(tmp_path: Path, base: str = OTHER, head: int = 1) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(f"version: 1\nbase_model: {base}\nedits:\n  - {{type: head, layer: 0, head: {head}, alpha: 2.0}}\n")
    return path


def _card(folder: Path) -> tuple[dict, str]:
    text = (folder / "README.md").read_text()
    return yaml.safe_load(text[4 : text.index("\n---", 4)]), text


def _reproduce_recipe(text: str) -> dict:
    """The recipe YAML block of the card's "Reproduce or undo" section."""
    section = text[text.index("## Reproduce or undo") :]
    start = section.index("```yaml\n") + len("```yaml\n")
    return yaml.safe_load(section[start : section.index("\n```", start)])


def test_recipe_of_another_model_is_refused_without_the_flag(tiny, tmp_path, capsys):
    """A recipe's α and n were chosen on its model: baking it into another one is a refusal (it was
    a note and exit 0), in one line naming both models and the flag, with nothing written."""
    model = tiny("llama")
    out = tmp_path / "baked"
    line = error_line(run_main(["apply", _recipe(tmp_path), "--model", model, "--out", out, "--no-verify"], capsys))
    assert f"the recipe was written for {OTHER}, not {model}" in line and "--allow-other-base" in line, line
    assert not out.exists()


def test_recipe_of_another_model_on_a_local_folder(tiny, tmp_path, capsys):
    model = tiny("llama")
    out = tmp_path / "baked"
    result = run_main(
        ["apply", _recipe(tmp_path), "--model", model, "--out", out, "--no-verify", "--json", "--allow-other-base"],
        capsys,
    )
    assert result.returncode == 0, result.stderr
    err = " ".join(result.stderr.split())
    assert f"note: the recipe was written for {OTHER}, not {model}; baked as --allow-other-base asks" in err
    summary = json.loads(result.stdout)
    assert any(OTHER in n for n in summary["notes"])
    prov = json.loads((out / "surgery.json").read_text())  # both names: the edited model and the recipe's
    assert prov["recipe"]["base_model"] == model.name and prov["recipe"]["notes"] == {"written_for": OTHER}
    meta, text = _card(out)
    assert "base_model" not in meta and "base_model_relation" not in meta  # was base_model: org/other-model
    assert _reproduce_recipe(text)["base_model"] == model.name  # the edited folder, by name: no local path on a card
    assert f"# {model.name} — edited with surgery" in text
    assert f"The recipe was written for **{OTHER}**, not for this model" in text


def test_recipe_of_another_model_on_a_hub_model(tiny, tmp_path, monkeypatch):
    cache = hub_cache(tiny("llama"), tmp_path / "hub")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))  # read at import: in this process
    out = tmp_path / "baked"
    result = run_here(
        ["apply", _recipe(tmp_path), "--model", "org/tiny-llama", "--out", out, "--no-verify", "--allow-other-base"],
    )
    assert result.returncode == 0, result.stderr
    assert f"note: the recipe was written for {OTHER}, not org/tiny-llama" in " ".join(result.stderr.split())
    meta, text = _card(out)
    assert meta["base_model"] == "org/tiny-llama" and meta["base_model_relation"] == "finetune"
    # the commit read, not the branch: main may have moved since
    assert f"`surgery apply recipe.yaml --model org/tiny-llama --revision {SNAPSHOT} --out OUT`" in text
    assert _reproduce_recipe(text)["base_model"] == "org/tiny-llama"
    assert OTHER not in meta.values() and "This is **org/tiny-llama**" in text
    assert f"The recipe was written for **{OTHER}**" in text
    # the recipe written for this very model: no note, no flag needed
    result = run_here(
        [
            "apply",
            _recipe(tmp_path, "ORG/tiny-llama"),
            "--model",
            "org/tiny-llama",
            "--out",
            tmp_path / "same",
            "--no-verify",
        ],
    )
    assert result.returncode == 0 and "note:" not in result.stderr, result.stderr
    assert "written for" not in (tmp_path / "same" / "README.md").read_text()


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
    assert same_model(str(tmp_path / "link"), Source(local))  # the same folder
    assert not same_model(str(tmp_path), Source(local))  # another folder
    assert same_model("HuggingFaceTB/smollm2-135m-instruct", Source(local))  # a copy named after its repo
    assert same_model("/elsewhere/smollm2-135m-instruct", Source(local))  # a path of another machine
    assert not same_model("HuggingFaceTB/SmolLM2-360M", Source(local))
    assert same_model("org/name", Source(snapshot))  # a Hub-cache snapshot
    assert same_model("Org/Name", Source(snapshot, "Org/Name"))
    assert not same_model("other/Name", Source(snapshot, "Org/Name"))  # two ids: the whole id


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
    assert prov[key]["transfer"] is True and prov[key]["model"] == "other"  # by name: surgery.json is published


def test_transfer_without_findings_is_refused(tiny, tmp_path, capsys):
    model = tiny("llama")
    line = error_line(run_main(["amplify-heads", model, "--alpha", "2", "--transfer", "--out", tmp_path / "o"], capsys))
    assert "--transfer applies to --findings" in line
    line = error_line(
        run_main(
            ["amplify-heads", model, "--heads", "0.1", "--alpha", "2", "--transfer", "--out", tmp_path / "o"], capsys
        )
    )
    assert "drop --findings / --top / --transfer" in line


@pytest.mark.parametrize("command", ["inspect", "apply"])
def test_revision_with_a_local_folder_is_refused(tiny, tmp_path, capsys, command):
    """A local folder is read as it is: --revision was silently ignored."""
    model = tiny("llama")
    args = {
        "inspect": ["inspect", model],
        "apply": ["apply", _recipe(tmp_path, str(model)), "--model", model, "--out", tmp_path / "o"],
    }[command]
    line = error_line(run_main([*args, "--revision", "v1"], capsys))
    assert f"--revision v1: MODEL {model} is a local folder" in line and "drop it, or give the Hub id" in line
    assert not (tmp_path / "o").exists()


def test_a_hub_cache_snapshot_folder_is_that_hub_model_at_its_commit(tiny, tmp_path, capsys):
    snapshot = hub_cache(tiny("llama"), tmp_path / "hub") / "models--org--tiny-llama" / "snapshots" / SNAPSHOT
    out = tmp_path / "baked"
    # a recipe made for org/tiny-llama fits this folder: no --allow-other-base needed
    result = run_main(
        ["apply", _recipe(tmp_path, "org/tiny-llama"), "--model", snapshot, "--out", out, "--no-verify"], capsys
    )
    assert result.returncode == 0 and "note:" not in result.stderr, result.stderr
    source = json.loads((out / "surgery.json").read_text())["source"]
    # the snapshot folder is named by its Hub repo: surgery.json is published, the local path is not
    assert (source["hub_id"], source["revision"], source["path"]) == ("org/tiny-llama", SNAPSHOT, "org/tiny-llama")
    meta, text = _card(out)
    assert meta["base_model"] == "org/tiny-llama" and "This is **org/tiny-llama**" in text
    assert f"--model org/tiny-llama --revision {SNAPSHOT} --out OUT" in text
    assert _reproduce_recipe(text)["base_model"] == "org/tiny-llama"


@pytest.mark.parametrize("revision", [None, "main"])
def test_a_hub_download_records_the_commit_it_read(tiny, tmp_path, revision, monkeypatch):
    """It recorded ``revision: null`` (or the branch asked for) while the commit was in its path."""
    cache = hub_cache(tiny("llama"), tmp_path / "hub")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    out = tmp_path / "baked"
    result = run_here(
        [
            "apply",
            _recipe(tmp_path, "org/tiny-llama"),
            "--model",
            "org/tiny-llama",
            "--out",
            out,
            "--no-verify",
            *(["--revision", revision] if revision else []),
        ],
    )
    assert result.returncode == 0, result.stderr
    source = json.loads((out / "surgery.json").read_text())["source"]
    assert source["hub_id"] == "org/tiny-llama" and source["revision"] == SNAPSHOT
