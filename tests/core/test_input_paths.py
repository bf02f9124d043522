"""Every reader of an input file says a folder is a folder, and a missing path is missing.

A folder given where a file belongs used to be told "does not exist", which sends the user looking
for a typo in a path that is there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from surgery.core.edits import Recipe
from surgery.core.errors import SurgeryError
from surgery.core.prompts import read_prompts
from surgery.core.vectors import FolderVectors
from surgery.evaluation.data import read_jsonl
from surgery.evaluation.markers import read_markers
from surgery.find.findings import load_findings
from surgery.find.heads.benchmark import load_benchmark
from surgery.find.neurons.pairs import load_pairs
from surgery.find.tune.record import read_record

READERS: dict[str, Callable[[Path], object]] = {
    "pairs": lambda p: load_pairs(str(p)),
    "prompts": lambda p: read_prompts(p, "a"),
    "markers": read_markers,
    "findings": lambda p: load_findings(p, "neurons"),
    "recipe": Recipe.load,
    "vector": lambda p: FolderVectors(p.parent).unit(f"{p.name}#r", None, "edits[0]"),
    "data": lambda p: read_jsonl(p, "N4"),
    "tune record": read_record,
    "benchmark": load_benchmark,
}


@pytest.mark.parametrize("reader", READERS.values(), ids=READERS.keys())
def test_a_folder_is_named_as_a_folder(reader, tmp_path):
    folder = tmp_path / "given"
    folder.mkdir()
    with pytest.raises(SurgeryError, match=f"{folder} is a folder"):
        reader(folder)
    with pytest.raises(SurgeryError, match=f"{tmp_path / 'missing'} does not exist"):
        reader(tmp_path / "missing")


@pytest.mark.parametrize(
    "reader", [r for name, r in READERS.items() if name != "vector"], ids=[n for n in READERS if n != "vector"]
)
def test_a_tilde_path_is_read_from_home(reader, tmp_path, monkeypatch):
    """A Python caller's "~/…" was taken literally ("~/given does not exist"); a shell expands it."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "given").mkdir()
    with pytest.raises(SurgeryError, match=f"{tmp_path / 'given'} is a folder"):
        reader(Path("~/given"))
