"""The user guides (docs/guides/) describe rules in words: a `module.function` of surgery's code means
nothing to their reader and goes stale when the code moves (heads.md named `screen.still_open` for the
screen's stopping rule). A name that is also a key of a file surgery writes (`screen.beyond_pool` in the
findings) is what a reader reads, and stays."""

from __future__ import annotations

import ast
import re

from tests.support.paths import REPO

DOTTED = re.compile(r"`([A-Za-z_]\w*)\.([A-Za-z_]\w*)`")


def _code_names() -> tuple[set[tuple[str, str]], set[str]]:
    """(module stem, top-level function) of every module of surgery/, and every dataclass field name
    (the keys of surgery's typed files and records)."""
    functions, fields = set(), set()
    for path in (REPO / "surgery").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        functions |= {(path.stem, n.name) for n in tree.body if isinstance(n, ast.FunctionDef)}
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            fields |= {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return functions, fields


def test_the_guides_name_no_function_of_the_code():
    functions, fields = _code_names()
    named = [
        f"{page.relative_to(REPO)}:{number}: {m.group(0)}"
        for page in sorted((REPO / "docs" / "guides").glob("*.md"))
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        for m in DOTTED.finditer(line)
        if m.groups() in functions and not set(m.groups()) <= fields
    ]
    assert not named, "say the rule in words, not the function: " + "; ".join(named)
