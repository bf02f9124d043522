"""A command that writes one report file (find-heads, find-neurons, find-direction, eval) refuses an
--out it cannot write before its work: a folder, a path below a file, a folder that cannot be
written, a file surgery did not write (surgery.core.destinations.check_out_file). The work is patched to fail the test if it runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from surgery.api import directions, heads, neurons
from tests.support.cli import error_line, run_main
from tests.support.tiny import build_tiny


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return build_tiny("llama", tmp_path_factory.mktemp("out-file") / "src")


@pytest.fixture(autouse=True)
def no_work(monkeypatch):
    """The finders and the evaluation, replaced by a failure: the refusal must come first."""

    def called(*args, **kwargs):
        pytest.fail("the work ran before --out was checked")

    for module, name in ((heads, "head_findings"), (neurons, "neuron_findings"), (directions, "direction_findings")):
        monkeypatch.setattr(module, name, called)
    monkeypatch.setattr("surgery.evaluation.suites.evaluate", called)


COMMANDS = {
    "find-heads": lambda src: ["find-heads", src],
    "find-neurons": lambda src: ["find-neurons", src],
    "find-direction": lambda src: ["find-direction", src, "--a", "a.txt", "--b", "b.txt"],
    "eval": lambda src: ["eval", src],
}


def _unwritable(monkeypatch, folder: Path) -> None:
    """``folder`` refuses writes, as the check asks (os.access): chmod cannot stop root."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if Path(p) == folder else real(p, mode, *a, **k))


REFUSALS = {
    "a folder": (lambda tmp: tmp, "is a folder; give the file to write, e.g. --out"),
    "below a file": (lambda tmp: tmp / "notes.txt" / "out.json", "lies below"),
    "an unwritable folder": (lambda tmp: tmp / "ro" / "out.json", "(permission denied); choose another --out"),
    "a file surgery did not write": (lambda tmp: tmp / "notes.txt", "notes.txt exists and was not written by surgery"),
}


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_out_file_that_cannot_be_written_is_refused_before_the_work(
    command, refusal, src, tmp_path, capsys, monkeypatch
):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "ro").mkdir()
    _unwritable(monkeypatch, tmp_path / "ro")
    where, expected = REFUSALS[refusal]
    line = error_line(run_main([*COMMANDS[command](src), "--out", where(tmp_path)], capsys))
    assert expected in line, line
    assert ".tmp" not in line, line
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_find_direction_checks_its_vectors_file_too(src, tmp_path, capsys):
    """--out d.json writes d.safetensors beside it: a folder there is refused up front, named."""
    (tmp_path / "d.safetensors").mkdir()
    line = error_line(run_main([*COMMANDS["find-direction"](src), "--out", tmp_path / "d.json"], capsys))
    assert f"{tmp_path / 'd.safetensors'} is a folder" in line, line


def test_find_direction_never_replaces_a_vectors_file_it_did_not_write(src, tmp_path, capsys):
    """d.safetensors beside a d.json that is not surgery's (here: none) may be the user's weights."""
    (tmp_path / "d.safetensors").write_bytes(b"mine")
    line = error_line(run_main([*COMMANDS["find-direction"](src), "--out", tmp_path / "d.json"], capsys))
    assert "d.safetensors exists and was not written by surgery" in line, line
    assert (tmp_path / "d.safetensors").read_bytes() == b"mine"
