"""--force replaces only what surgery wrote (or an empty folder), in every command that has it, and a
symlinked --out is never followed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from surgery.core.destinations import OUTPUT_MARKERS, surgery_output
from surgery.core.edits import HeadScale, Recipe
from surgery.core.staging import atomic_write_text
from tests.support.cli import error_line, run_main, staging_leftovers, tree_hashes
from tests.support.tiny import build_tiny

FOREIGN = ("was not written by surgery", "remove it yourself or choose another --out")


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """A tiny llama, its bake, a recipe, a findings file and a GGUF: the inputs of every --force command."""
    from surgery.bake.bake import bake
    from surgery.core.checkpoint import Checkpoint
    from surgery.find.findings import new_findings, save_findings
    from surgery.find.heads.record import HeadsFindings
    from tests.support.tiny_gguf import gguf_source_model, write_tiny_gguf

    root = tmp_path_factory.mktemp("force")
    src = build_tiny("llama", root / "src")
    recipe = Recipe((HeadScale(0, 1, 2.0),))
    bake(Checkpoint(src), recipe, root / "baked")
    (root / "recipe.yaml").write_text(recipe.to_yaml())
    findings = new_findings("heads", Checkpoint(src), "0" * 64, {"benchmark": "builtin"}, "test")
    findings["selected_heads"] = [[0, 1]]
    save_findings(HeadsFindings.from_dict(findings), root / "findings.json")
    write_tiny_gguf(root / "tiny.gguf", gguf_source_model())
    return {
        "root": root,
        "src": src,
        "baked": root / "baked",
        "recipe": root / "recipe.yaml",
        "findings": root / "findings.json",
        "gguf": root / "tiny.gguf",
    }


COMMANDS = {
    "amplify-heads": lambda m, out: [
        "amplify-heads",
        m["src"],
        "--heads",
        "0.1",
        "--alpha",
        "2",
        "--out",
        out,
        "--no-verify",
    ],
    "apply": lambda m, out: ["apply", m["recipe"], "--model", m["src"], "--out", out, "--no-verify"],
    "undo": lambda m, out: ["undo", m["baked"], "--out", out],
    "export-lora": lambda m, out: ["export-lora", m["src"], "--recipe", m["recipe"], "--out", out],
    "report": lambda m, out: ["report", m["findings"], "--out", out],
    "import-gguf": lambda m, out: ["import-gguf", m["gguf"], "--out", out],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_force_replaces_only_what_surgery_wrote(command, made, tmp_path, capsys):
    """Each command's --force: a folder of the user's is refused in one line and left as it was; an
    empty folder and the command's own earlier output are replaced."""
    if command == "report":
        pytest.importorskip("matplotlib")
    args = COMMANDS[command]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    (mine / "sub").mkdir()
    (mine / "sub" / "data.csv").write_text("1,2,3")
    before = tree_hashes(mine)
    line = error_line(run_main([*args(made, mine), "--force"], capsys))
    assert all(n in line for n in FOREIGN), line
    assert tree_hashes(mine) == before and staging_leftovers(tmp_path) == []

    out = tmp_path / "out"
    out.mkdir()  # empty: replaced
    first = run_main([*args(made, out), "--force"], capsys)
    assert first.returncode == 0, first.stderr
    written = tree_hashes(out)
    assert written
    again = run_main([*args(made, out), "--force"], capsys)  # its own earlier output: replaced
    assert again.returncode == 0, again.stderr
    assert tree_hashes(out).keys() == written.keys() and staging_leftovers(tmp_path) == []


@pytest.mark.parametrize("force", [True, False], ids=["force", "plain"])
def test_a_symlinked_out_is_never_followed(force, made, tmp_path, capsys):
    """--out is a link to a folder surgery wrote (which --force could replace): refused, the link
    and what it points to untouched."""
    import shutil

    real = tmp_path / "real"
    shutil.copytree(made["baked"], real)
    before = tree_hashes(real)
    link = tmp_path / "link"
    link.symlink_to(real)
    args = COMMANDS["amplify-heads"](made, link)
    line = error_line(run_main([*args, *(["--force"] if force else [])], capsys))
    assert "is a symbolic link" in line and "give the folder itself or another --out" in line
    assert link.is_symlink() and link.readlink() == real
    assert tree_hashes(real) == before and staging_leftovers(tmp_path) == []


def test_undo_force_replaces_only_an_earlier_restore_of_the_same_bake(made, tmp_path, capsys):
    """A restore carries no marker (it is the source byte for byte): its content decides."""
    out = tmp_path / "restored"
    assert run_main(["undo", made["baked"], "--out", out], capsys).returncode == 0
    assert run_main(["undo", made["baked"], "--out", out, "--force"], capsys).returncode == 0
    assert tree_hashes(out) == tree_hashes(made["src"])
    (out / "notes.txt").write_text("added by the user")  # no longer just a restore
    line = error_line(run_main(["undo", made["baked"], "--out", out, "--force"], capsys))
    assert all(n in line for n in FOREIGN) and (out / "notes.txt").read_text() == "added by the user"


def test_sweep_writes_into_an_existing_folder_but_force_replaces_only_its_values(made, tmp_path, capsys):
    """A sweep's folder is a container (never replaced): it may hold the user's files; --force
    replaces a value folder only when surgery wrote it."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "notes.txt").write_text("mine")
    args = ["amplify-heads", made["src"], "--heads", "0.1", "--alpha", "2,3", "--out", sweep, "--no-verify", "--force"]
    assert run_main(args, capsys).returncode == 0
    assert (sweep / "notes.txt").read_text() == "mine" and surgery_output(sweep / "alpha-3")
    (sweep / "alpha-3" / "surgery.json").unlink()  # no longer recognisably surgery's
    line = error_line(run_main(args, capsys))
    assert "alpha-3 exists and was not written by surgery" in line


def test_markers_are_what_the_commands_write():
    """The marker table of surgery.core.destinations names each command's own file and format."""
    from surgery.bake.provenance import ADAPTER_PROVENANCE_NAME as ADAPTER_PROVENANCE
    from surgery.bake.provenance import FORMAT, PROVENANCE_NAME
    from surgery.gguf.importing import MANIFEST_NAME as GGUF_MANIFEST
    from surgery.ship.report import MANIFEST_NAME as REPORT_MANIFEST

    assert OUTPUT_MARKERS == {
        PROVENANCE_NAME: FORMAT,
        ADAPTER_PROVENANCE: "surgery-adapter",
        GGUF_MANIFEST: "surgery-gguf-import",
        REPORT_MANIFEST: "surgery-report",
    }


@pytest.mark.parametrize("content", ["not json", json.dumps({"format": "something-else"}), json.dumps([1])])
def test_a_marker_file_of_another_kind_is_not_a_surgery_output(content, tmp_path):
    (tmp_path / "surgery.json").write_text(content)
    assert not surgery_output(tmp_path)


ADDED = {"eval.json": '{"kl_mean": 0.01}', "plots/x.png": "not really a png"}


@pytest.mark.parametrize("command", sorted(set(COMMANDS) - {"undo"}))
def test_force_refuses_an_output_holding_files_the_user_added(command, made, tmp_path, capsys):
    """Issue 33.7: files added to a previous output (an eval JSON, a plots/ folder) make --force
    refuse in one line naming them, and stay; without them the output is replaced as before."""
    if command == "report":
        pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    assert run_main(COMMANDS[command](made, out), capsys).returncode == 0
    for rel, text in ADDED.items():
        (out / rel).parent.mkdir(exist_ok=True)
        (out / rel).write_text(text)
    before = tree_hashes(out)
    line = error_line(run_main([*COMMANDS[command](made, out), "--force"], capsys))
    assert "holds 2 files that surgery did not write (eval.json, plots/x.png)" in line, line
    assert "move them out of the folder, or choose another --out" in line, line
    assert tree_hashes(out) == before and staging_leftovers(tmp_path) == []

    for rel in ADDED:  # moved out: replaced
        (out / rel).unlink()
    (out / "plots").rmdir()
    again = run_main([*COMMANDS[command](made, out), "--force"], capsys)
    assert again.returncode == 0, again.stderr
    assert not (out / "plots").exists() and staging_leftovers(tmp_path) == []


def test_force_names_a_few_added_files_and_counts_the_rest(made, tmp_path, capsys):
    """Many added files (and an empty folder) are named three at a time, the rest counted."""
    out = tmp_path / "out"
    args = COMMANDS["apply"](made, out)
    assert run_main(args, capsys).returncode == 0
    for i in range(4):
        (out / f"run{i}.json").write_text("{}")
    (out / "plots").mkdir()
    line = error_line(run_main([*args, "--force"], capsys))
    assert "holds 5 files that surgery did not write (plots/, run0.json, run1.json and 2 more)" in line, line
    assert (out / "plots").is_dir() and len(list(out.glob("run*.json"))) == 4


def test_force_refuses_an_output_whose_marker_lists_no_files(made, tmp_path, capsys):
    """An output whose marker does not list its files (a report of an earlier surgery) cannot be told
    from one the user added to: refused, left as it was."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "report"
    args = COMMANDS["report"](made, out)
    assert run_main(args, capsys).returncode == 0
    manifest = json.loads((out / "surgery_report.json").read_text())
    assert sorted(manifest.pop("files")) == sorted(p.name for p in out.iterdir() if p.name != "surgery_report.json")
    (out / "surgery_report.json").write_text(json.dumps(manifest))
    before = tree_hashes(out)
    line = error_line(run_main([*args, "--force"], capsys))
    assert "surgery_report.json does not list its files" in line and "remove it yourself" in line, line
    assert tree_hashes(out) == before


def test_a_failed_atomic_write_names_its_destination_not_its_temporary(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(IsADirectoryError) as caught:
        atomic_write_text(tmp_path / "taken", "{}")
    assert caught.value.filename == str(tmp_path / "taken") and ".tmp" not in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # the temporary is gone
