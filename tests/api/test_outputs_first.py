"""A command that finds and then bakes refuses a taken or unwritable --out before it finds anything: the
finder (hours on a real model) is patched to fail the test if it is called at all, and each refusal
is the bake's own one line (surgery.api.baking.check_outputs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import surgery
from surgery.api import directions, heads, neurons, tuning
from surgery.core import optional
from surgery.core.errors import DestinationError
from tests.support.cli import error_line, run_main, tree_hashes
from tests.support.tiny import build_tiny


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return build_tiny("llama", tmp_path_factory.mktemp("outputs-first") / "src")


@pytest.fixture(autouse=True)
def no_finding(monkeypatch):
    """Every finder a baking command may run, replaced by a failure: the refusal must come first."""

    def called(*args, **kwargs):
        pytest.fail("the finder ran before the destination was checked")

    for module, name in (
        (heads, "head_findings"),
        (neurons, "neuron_findings"),
        (directions, "direction_findings"),
        (tuning, "_findings"),
    ):
        monkeypatch.setattr(module, name, called)
    # tune asks for optuna first; the refusal it must give next does not need it installed
    real = optional.require
    monkeypatch.setattr(optional, "require", lambda module: None if module == "optuna" else real(module))


def unwritable(monkeypatch, folder: Path) -> None:
    """``folder`` refuses writes, as the destination checks ask (os.access): chmod cannot stop root."""
    real = os.access

    def access(path, mode, *args, **kwargs):
        if Path(path) == folder and mode & os.W_OK:
            return False
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


# Each command that finds and then bakes: its arguments for one output (``sweep``: for two values,
# where it has a sweep) and the label of its second sweep value.
COMMANDS = {
    "amplify-heads": lambda src, tmp, sweep: ["amplify-heads", src, "--alpha", "2,3" if sweep else "2"],
    "prune-neurons": lambda src, tmp, sweep: ["prune-neurons", src, "--n", "2,3" if sweep else "2"],
    "ablate-direction": lambda src, tmp, sweep: ["ablate-direction", src, "--direction", tmp / "direction.json"],
    "tune": lambda src, tmp, sweep: ["tune", src, "--findings", tmp / "findings.json"],
}
SWEEPS = {"amplify-heads": "alpha-3", "prune-neurons": "n-3"}
PUSHES = ("amplify-heads", "prune-neurons", "ablate-direction")  # tune has no --push-to


def _out_flag(command: str) -> str:
    return "--bake" if command == "tune" else "--out"


def _taken(tmp: Path) -> tuple[Path, list[str]]:
    (tmp / "taken").mkdir()
    (tmp / "taken" / "notes.txt").write_text("mine")
    return tmp / "taken", []


def _taken_forced(tmp: Path) -> tuple[Path, list[str]]:
    return _taken(tmp)[0], ["--force"]


def _a_file(tmp: Path) -> tuple[Path, list[str]]:
    (tmp / "notes.txt").write_text("mine")
    return tmp / "notes.txt", []


REFUSALS = {
    "taken": (_taken, "already exists; pass --force to replace it"),
    # was "already exists; pass --force to replace it", then with --force "exists and is not a folder"
    "a file, without --force": (_a_file, "notes.txt exists and is not a folder; remove it or choose another --out"),
    "not surgery's, with --force": (_taken_forced, "was not written by surgery"),
    "inside the source": (None, "is inside the source"),
    "parent missing": (lambda tmp: (tmp / "no" / "edited", []), "the parent folder of"),
    "parent read-only": (lambda tmp: (tmp / "ro" / "edited", []), "(permission denied); choose another --out"),
    "push target": (lambda tmp: (tmp / "edited", ["--push-to", "not a repo"]), "is not a Hub repo id"),
}


@pytest.mark.parametrize(
    ("command", "refusal"),
    [(c, r) for c in sorted(COMMANDS) for r in sorted(REFUSALS) if r != "push target" or c in PUSHES],
)
def test_a_refused_out_comes_before_any_finding(command, refusal, src, tmp_path, capsys, monkeypatch):
    setup, expected = REFUSALS[refusal]
    out, extra = setup(tmp_path) if setup is not None else (src / "edited", [])
    if refusal == "parent read-only":
        (tmp_path / "ro").mkdir()
        unwritable(monkeypatch, tmp_path / "ro")
    before = tree_hashes(src)
    args = [*COMMANDS[command](src, tmp_path, False), _out_flag(command), out, *extra]
    line = error_line(run_main(args, capsys))
    assert expected in line, line
    assert tree_hashes(src) == before and not (src / "edited").exists()


SWEEP_REFUSALS = {
    "a value's output taken": (lambda tmp, label: tmp / "sweep", "; pass --force to bake them again"),
    "below a file": (lambda tmp, label: tmp / "notes.txt" / "sweep", "which is a file, not a folder"),
    "folder read-only": (lambda tmp, label: tmp / "ro" / "sweep", "(permission denied); choose another --out"),
}


@pytest.mark.parametrize("refusal", sorted(SWEEP_REFUSALS))
@pytest.mark.parametrize("command", sorted(SWEEPS))
def test_a_sweep_checks_every_value_before_any_finding(command, refusal, src, tmp_path, capsys, monkeypatch):
    """The sweep's folder may exist (it holds the values) or be made with its parents; a value's
    output that is taken, or a folder that cannot be made or written, is refused up front."""
    label = SWEEPS[command]
    (tmp_path / "sweep" / label).mkdir(parents=True)
    (tmp_path / "sweep" / label / "notes.txt").write_text("mine")
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "ro").mkdir()
    unwritable(monkeypatch, tmp_path / "ro")
    where, expected = SWEEP_REFUSALS[refusal]
    args = [*COMMANDS[command](src, tmp_path, True), "--out", where(tmp_path, label)]
    line = error_line(run_main(args, capsys))
    assert expected in line, line
    if refusal == "a value's output taken":
        assert label in line, line


def test_a_gguf_model_refuses_an_out_it_cannot_bake_into_before_any_finding(tmp_path, capsys):
    from tests.support.tiny_gguf import gguf_source_model, write_tiny_gguf

    model = tmp_path / "tiny.gguf"
    write_tiny_gguf(model, gguf_source_model())
    line = error_line(run_main(["amplify-heads", model, "--alpha", "2", "--out", tmp_path / "edited"], capsys))
    assert "must end in .gguf" in line, line
    (tmp_path / "taken.gguf").write_bytes(b"mine")
    line = error_line(run_main(["amplify-heads", model, "--alpha", "2", "--out", tmp_path / "taken.gguf"], capsys))
    assert "already exists; pass --force" in line, line


def test_the_library_refuses_before_any_finding_too(src, tmp_path):
    """Python callers get the same refusal, spelled for them, from the bakes and from check_outputs."""
    out, _ = _taken(tmp_path)
    for bake in (lambda: surgery.amplify_heads(src, out, alpha=2.0), lambda: surgery.prune_neurons(src, out, n=2)):
        with pytest.raises(DestinationError, match=r"pass bake=surgery.BakeOptions\(force=True\) to replace it"):
            bake()
    (tmp_path / "sweep" / "alpha-3").mkdir(parents=True)
    (tmp_path / "sweep" / "alpha-3" / "notes.txt").write_text("mine")
    with pytest.raises(DestinationError, match="sweep already holds alpha-3; not yet baked: alpha-2"):
        surgery.api.check_outputs(src, tmp_path / "sweep", labels=["alpha-2", "alpha-3"])
    surgery.api.check_outputs(src, tmp_path / "sweep", labels=["alpha-2", "alpha-4"])  # a free value passes


@pytest.mark.parametrize("sweep", [False, True], ids=["one", "sweep"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_folder_model_refuses_an_out_named_gguf_before_any_finding(command, sweep, src, tmp_path, capsys):
    """A folder bakes into a folder: `--out model.gguf` wrote a folder named model.gguf, which looks like
    a GGUF file surgery does not make from a folder (as a GGUF model refuses an --out not named .gguf)."""
    if sweep and command not in SWEEPS:
        pytest.skip(f"{command} has no sweep")
    out = tmp_path / "edited.gguf"
    line = error_line(run_main([*COMMANDS[command](src, tmp_path, sweep), _out_flag(command), out], capsys))
    assert "ends in .gguf, but MODEL is a checkpoint folder, which bakes into a folder" in line, line
    assert not out.exists()


def test_apply_of_a_folder_refuses_an_out_named_gguf(src, tmp_path, capsys):
    (tmp_path / "recipe.yaml").write_text("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: 2}\n")
    out = tmp_path / "edited.gguf"
    line = error_line(run_main(["apply", tmp_path / "recipe.yaml", "--model", src, "--out", out], capsys))
    assert "ends in .gguf, but MODEL is a checkpoint folder" in line, line
    assert not out.exists()


@pytest.mark.parametrize("refusal", ["parent missing", "taken"])
def test_apply_of_a_gguf_refuses_its_out_before_computing_blocks(refusal, tmp_path, capsys, monkeypatch):
    """`apply` to a GGUF checked its --out only when it wrote: the edited blocks were computed and a
    note printed first (the folder bake refused at once)."""
    import surgery.bake.gguf as gguf_bake
    from tests.support.tiny_gguf import gguf_source_model, write_tiny_gguf

    model = tmp_path / "tiny.gguf"
    write_tiny_gguf(model, gguf_source_model())
    (tmp_path / "recipe.yaml").write_text("version: 1\nedits:\n  - {type: neuron, layer: 0, neuron: 1, factor: 0}\n")
    monkeypatch.setattr(gguf_bake, "prepare", lambda *a, **k: pytest.fail("blocks computed before --out was checked"))
    out = tmp_path / "no" / "edited.gguf" if refusal == "parent missing" else tmp_path / "taken.gguf"
    (tmp_path / "taken.gguf").write_bytes(b"mine")
    line = error_line(run_main(["apply", tmp_path / "recipe.yaml", "--model", model, "--out", out], capsys))
    assert ("the parent folder of" if refusal == "parent missing" else "already exists; pass --force") in line, line
