"""A missing package is one line naming it and the pip command, never an "internal error".

Each command runs in a subprocess with the package hidden (``sys.modules[name] = None`` makes every
import of it fail, as on a machine where it was never installed).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from surgery.core.optional import OPTIONAL, MissingDependency, pip_command, pip_install, require
from tests.support.cli import REPO, cli_env

HIDDEN_RUN = "import sys; sys.modules[{name!r}] = None; from surgery.cli.main import main; main({argv!r})"


def run_hidden(name: str, argv: list[str]) -> subprocess.CompletedProcess:
    """The CLI with the package ``name`` made unimportable."""
    code = HIDDEN_RUN.format(name=name, argv=[str(a) for a in argv])
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO, env=cli_env()
    )


def _report_input(tmp_path: Path) -> Path:
    from surgery.core.evaluation_result import new_result, save_result

    result = new_result({"path": "m"}, None, {"limit": 1})
    result["metrics"] = {"model": {"perplexity": 3.0}}
    save_result(result, tmp_path / "eval.json")
    return tmp_path / "eval.json"


def _int_bake_input(tmp_path: Path) -> list:
    """A recipe and a tiny int4 checkpoint (its codes are decoded by compressed-tensors)."""
    from surgery.core.edits import NeuronScale, Recipe
    from tests.support.int_packed import build_int

    (tmp_path / "r.yaml").write_text(Recipe((NeuronScale(0, 1, 0.0),)).to_yaml(), encoding="utf-8")
    return [tmp_path / "r.yaml", "--model", build_int(tmp_path / "int4", "w4a16-g8")]


@pytest.mark.parametrize(
    "name, extra, argv",
    [
        ("gguf", "gguf", lambda tmp: ["import-gguf", tmp / "model.gguf", "--out", tmp / "out"]),
        ("matplotlib", "plots", lambda tmp: ["report", "--eval", _report_input(tmp), "--out", tmp / "out"]),
        ("lm_eval", "lmeval", lambda tmp: ["eval", tmp, "--lm-eval", "arc_easy"]),
        ("compressed_tensors", "quant", lambda tmp: ["apply", *_int_bake_input(tmp), "--out", tmp / "out"]),
        ("optuna", "tune", lambda tmp: ["tune", tmp, "--out", tmp / "out"]),
    ],
)
def test_each_optional_package_missing_is_one_line(tmp_path, name, extra, argv):
    (tmp_path / "model.gguf").write_bytes(b"GGUF")  # never read: the package check comes first
    proc = run_hidden(name, argv(tmp_path))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    assert lines[0].endswith(f": {pip_install(extra)}") and OPTIONAL[name].distribution in lines[0]
    assert "internal error" not in proc.stderr and not (tmp_path / "out").exists()


def test_every_optional_package_is_covered_by_the_test_above():
    assert set(OPTIONAL) == {"gguf", "matplotlib", "lm_eval", "compressed_tensors", "optuna"}


def test_a_package_missing_anywhere_else_names_it_and_how_to_reinstall(tmp_path):
    """A partial install (a core dependency gone) is still one line, not a traceback."""
    proc = run_hidden("yaml", ["apply", tmp_path / "r.yaml", "--model", tmp_path, "--out", tmp_path / "o"])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "Error: the package 'yaml' is missing from this installation; install "
        f"surgery's dependencies again: {pip_install()}"
    )


def test_the_hint_installs_from_the_clone_this_copy_was_installed_from():
    """llm-surgery is not on PyPI: from a clone (how the docs install it) the hint names the clone.

    This test environment installed the repository in editable mode, as the docs and .ci/run do.
    """
    command = pip_install("plots")
    assert command.startswith("pip install -e '") and command.endswith("[plots]'"), command
    assert (Path(command.split("'")[1].removesuffix("[plots]")) / "pyproject.toml").is_file()


@pytest.mark.parametrize(
    "direct_url, command",
    [
        (
            {"url": "file:///home/me/surgery", "dir_info": {"editable": True}},
            "pip install -e '/home/me/surgery[plots]'",
        ),
        ({"url": "file:///home/me/my%20clone", "dir_info": {}}, "pip install '/home/me/my clone[plots]'"),
        (
            {
                "url": "https://example.org/me/surgery.git",
                "vcs_info": {"vcs": "git", "commit_id": "0123abc", "requested_revision": "main"},
            },
            "pip install 'llm-surgery[plots] @ git+https://example.org/me/surgery.git@0123abc'",
        ),
        (
            {"url": "https://example.org/llm_surgery-0.1.0-py3-none-any.whl", "archive_info": {}},
            "pip install 'llm-surgery[plots] @ https://example.org/llm_surgery-0.1.0-py3-none-any.whl'",
        ),
        (None, "pip install 'llm-surgery[plots]'"),  # installed from an index: the name is enough there
    ],
)
def test_pip_command_for_each_way_surgery_can_be_installed(direct_url, command):
    assert pip_command(direct_url, "plots") == command


def test_pip_command_from_a_source_tree_that_was_never_installed(tmp_path):
    assert pip_command(None, "lmeval", tmp_path) == f"pip install -e '{tmp_path}[lmeval]'"
    assert pip_command(None, None, tmp_path) == f"pip install -e {tmp_path}"


def test_require_reraises_a_broken_import_inside_the_package(monkeypatch):
    """Only the package itself being absent is explained; an error inside it stays an error."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingDependency, match=re.escape(pip_install("plots"))):
        require("matplotlib")
    err = ModuleNotFoundError("No module named 'pyparsing'", name="pyparsing")

    def broken(name, *a, **k):
        raise err

    monkeypatch.setattr("importlib.import_module", broken)
    with pytest.raises(ModuleNotFoundError):
        require("matplotlib")
