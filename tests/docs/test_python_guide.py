"""docs/guides/python.md runs as written (issue 33.8): each Python block, unchanged, in a home whose
``~/.cache/surgery/models/smollm2-135m-instruct`` is a random model of SmolLM2-135M's layer and head
counts (narrow, with the tests' character tokenizer), so the indices the page uses exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import cli_env
from tests.support.paths import REPO
from tests.support.tiny import build_tiny
from tests.support.tokenizer import TINY_VOCAB, save_char_tokenizer

PAGE = REPO / "docs" / "guides" / "python.md"
MODEL = Path(".cache/surgery/models/smollm2-135m-instruct")  # under HOME, as the page names it


def _blocks() -> dict[str, str]:
    """The page's Python blocks by the heading of their section."""
    blocks, heading = {}, ""
    for part in re.split(r"(?m)^(## .*)$", PAGE.read_text(encoding="utf-8")):
        if part.startswith("## "):
            heading = part[3:].strip()
        for body in re.findall(r"```python\n(.*?)```", part, flags=re.S):
            blocks[heading] = body
    return blocks


@pytest.fixture(scope="module")
def small_home(tmp_path_factory) -> Path:
    """A home holding a 3-layer model at the page's path: for the finders, whose cost grows with
    layers and heads and which need no particular index."""
    home = tmp_path_factory.mktemp("small-home")
    save_char_tokenizer(build_tiny("llama", home / MODEL, vocab_size=TINY_VOCAB))
    return home


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A home holding the SmolLM2-shaped model where examples/get_models.py puts the real one."""
    home = tmp_path_factory.mktemp("home")
    model = build_tiny(
        "llama",
        home / MODEL,
        num_hidden_layers=30,  # SmolLM2-135M: 30 layers of 9 heads (3 key/value heads)
        num_attention_heads=9,
        num_key_value_heads=3,
        hidden_size=72,
        intermediate_size=64,
        vocab_size=TINY_VOCAB,
    )
    save_char_tokenizer(model)
    return home


def _run(code: str, home: Path, cwd: Path) -> subprocess.CompletedProcess:
    cwd.mkdir()
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=cli_env(HOME=str(home)),
        timeout=600,
    )


def test_the_page_has_the_blocks_this_test_runs():
    assert set(_blocks()) == {"Options", "Writing your own edit"}


def test_writing_your_own_edit_runs_as_written(home, tmp_path):
    """The reported case: the block was refused (its recipe named another base_model than the
    folder it baked); as written now it bakes, and its output names the model the recipe was for."""
    run = _run(_blocks()["Writing your own edit"], home, tmp_path / "work")
    assert run.returncode == 0, run.stderr
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in run.stdout
    record = json.loads((tmp_path / "work" / "out" / "surgery.json").read_text())
    assert [e["type"] for e in record["recipe"]["edits"]] == ["head", "neuron"]


def test_a_folder_named_otherwise_is_another_model_as_the_page_says(home, tmp_path):
    """The variant the page warns about: the same block on a copy named ``models/smollm2`` is
    refused in one line that names both models and allow_other_base's flag; nothing is written."""
    shutil.copytree(home / MODEL, tmp_path / "models" / "smollm2")
    code = _blocks()["Writing your own edit"].replace(f'"~/{MODEL.as_posix()}"', f'"{tmp_path}/models/smollm2"')
    assert code != _blocks()["Writing your own edit"]
    run = _run(code, home, tmp_path / "work")
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert "RecipeError: the recipe was written for HuggingFaceTB/SmolLM2-135M-Instruct" in last, run.stderr
    assert "allow_other_base=True" in last and not (tmp_path / "work" / "out").exists()


def test_options_runs_as_written(small_home, tmp_path):
    """prune_neurons (a sweep of n) and find_heads with the page's options, on the page's path, of a
    3-layer model; only find_heads' size is cut (96 pairs × 10 random sets take over 10 min on 2
    busy cores), to 4 pairs and 1 random set."""
    code = _blocks()["Options"]
    small = code.replace("max_pairs=96, random_sets=10", "max_pairs=4, random_sets=1")
    assert small != code
    run = _run(small, small_home, tmp_path / "work")
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in (tmp_path / "work" / "pruned").iterdir()) == ["n-20", "n-40"]
    assert json.loads((tmp_path / "work" / "named" / "surgery.json").read_text())["recipe"]["edits"] == [
        {"type": "neuron", "layer": layer, "neuron": neuron, "factor": 0.0} for layer, neuron in ((1, 5), (2, 17))
    ]
