"""Counts read in the right number: "1 edit", "2 edits", never "edit(s)" in what users read."""

from __future__ import annotations

import ast
import re

from surgery.core.counted import counted, in_number
from tests.support.paths import REPO

PACKAGE = REPO / "surgery"

# a noun with "(s)" glued on: "tensor(s)"; not a call such as len(s)
MAYBE_PLURAL = re.compile(r"[A-Za-z]{2,}\(s\)")


def test_one_is_singular_and_the_rest_plural():
    assert [counted(n, "edit") for n in (0, 1, 2)] == ["0 edits", "1 edit", "2 edits"]
    assert counted(3, "more problem") == "3 more problems"
    assert (in_number(1, "key"), in_number(2, "key"), in_number(2, "index", "indices")) == ("key", "keys", "indices")


def _texts(path) -> list[str]:
    """Every string literal of the module (an f-string's literal parts included)."""
    return [
        n.value
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def test_no_message_says_noun_s():
    found = [
        f"{path.relative_to(REPO).as_posix()}: {text.strip()[:60]!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for text in _texts(path)
        if MAYBE_PLURAL.search(text)
    ]
    assert not found, "use surgery.core.counted (counted / in_number): " + "; ".join(found)
