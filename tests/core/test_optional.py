"""A missing package is one line naming it and the pip command, never an "internal error".

Each command runs in a subprocess with the package hidden (``sys.modules[name] = None`` makes every
import of it fail, as on a machine where it was never installed).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from surgery.core.optional import OPTIONAL, MissingDependency, require
from tests.support.cli import REPO, cli_env

HIDDEN_RUN = "import sys; sys.modules[{name!r}] = None; from surgery.cli.main import main; main({argv!r})"


def run_hidden(name: str, argv: list[str]) -> subprocess.CompletedProcess:
    """The CLI with the package ``name`` made unimportable."""
    code = HIDDEN_RUN.format(name=name, argv=[str(a) for a in argv])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=cli_env())


def _report_input(tmp_path: Path) -> Path:
    from surgery.evaluate.data import new_result, save_result

    result = new_result({"path": "m"}, None, {"limit": 1})
    result["metrics"] = {"model": {"perplexity": 3.0}}
    save_result(result, tmp_path / "eval.json")
    return tmp_path / "eval.json"


@pytest.mark.parametrize("name, extra, argv", [
    ("gguf", "gguf", lambda tmp: ["import-gguf", tmp / "model.gguf", "--out", tmp / "out"]),
    ("matplotlib", "plots", lambda tmp: ["report", "--eval", _report_input(tmp), "--out", tmp / "out"]),
    ("lm_eval", "lmeval", lambda tmp: ["eval", tmp, "--lm-eval", "arc_easy"]),
])
def test_each_optional_package_missing_is_one_line(tmp_path, name, extra, argv):
    (tmp_path / "model.gguf").write_bytes(b"GGUF")  # never read: the package check comes first
    proc = run_hidden(name, argv(tmp_path))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    assert f"pip install 'llm-surgery[{extra}]'" in lines[0] and OPTIONAL[name].distribution in lines[0]
    assert "internal error" not in proc.stderr and not (tmp_path / "out").exists()


def test_every_optional_package_is_covered_by_the_test_above():
    assert set(OPTIONAL) == {"gguf", "matplotlib", "lm_eval"}


def test_a_package_missing_anywhere_else_names_it_and_how_to_reinstall(tmp_path):
    """A partial install (a core dependency gone) is still one line, not a traceback."""
    proc = run_hidden("yaml", ["apply", tmp_path / "r.yaml", "--model", tmp_path, "--out", tmp_path / "o"])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == ("Error: the package 'yaml' is missing from this installation; reinstall "
                                   "surgery (pip install --force-reinstall llm-surgery)")


def test_require_reraises_a_broken_import_inside_the_package(monkeypatch):
    """Only the package itself being absent is explained; an error inside it stays an error."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingDependency, match=r"llm-surgery\[plots\]"):
        require("matplotlib")
    err = ModuleNotFoundError("No module named 'pyparsing'", name="pyparsing")

    def broken(name, *a, **k):
        raise err

    monkeypatch.setattr("importlib.import_module", broken)
    with pytest.raises(ModuleNotFoundError):
        require("matplotlib")
