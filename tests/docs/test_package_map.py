"""The package map (docs/contributing/architecture.md, "Layout") names every module of surgery/: a module
added without a word there fails here, so the map a contributor reads cannot fall behind the code."""

from __future__ import annotations

import re

from tests.support.paths import REPO

PACKAGE = REPO / "surgery"
PAGE = REPO / "docs" / "contributing" / "architecture.md"


def _rows() -> dict[str, str]:
    """The map's rows by the folder they describe, relative to surgery/ (``find/heads``)."""
    text = PAGE.read_text(encoding="utf-8")
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `surgery/([a-z_/]+)/` \|.*$", text, re.M)}


def test_every_module_is_on_the_package_map():
    rows = _rows()
    unnamed = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if "/" not in rel or path.name == "__init__.py":
            continue  # the entry points, and packages described by their row
        folder = max((f for f in rows if rel.startswith(f + "/")), key=len, default=None)
        if folder is None:
            unnamed.append(f"{rel} (no row for surgery/{rel.split('/')[0]}/)")
            continue
        inner = rel[len(folder) + 1 :]
        if inner not in rows[folder] and path.name not in rows[folder]:
            unnamed.append(f"{rel} (row surgery/{folder}/)")
    assert not unnamed, "say what these modules do on docs/contributing/architecture.md's map: " + ", ".join(unnamed)
