"""The house as drawn from its imports: no circles, the command line on top, the library below it.

Every ``import`` of every module under surgery/ counts, also those inside functions (a lazy import
is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO

PACKAGE = REPO / "surgery"
# Below the command line: these never import it, nor a screen library.
LIBRARY = ("surgery.core", "surgery.model", "surgery.find", "surgery.bake", "surgery.evaluate", "surgery.ship")
SCREEN = ("click", "rich")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str) -> set[str]:
    """Absolute names of everything module ``name`` imports (modules of surgery and third parties)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            # `from . import hooks`: the names may be modules themselves
            found |= {f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in MODULES}
    return found


def _ancestor(package: str, name: str) -> bool:
    return name.startswith(package + ".")


# A module importing its own parent package (``from . import x``) is how Python runs, not a circle.
GRAPH = {name: {m for m in _imports(name) if m in MODULES and m != name and not _ancestor(m, name)}
         for name in MODULES}


def _cycle() -> list[str] | None:
    """One import cycle among surgery's modules, or None (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(GRAPH):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circles():
    cycle = _cycle()
    assert cycle is None, " → ".join(cycle or [])


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith(LIBRARY)))
def test_the_library_never_reaches_up_to_the_command_line_or_the_screen(name):
    imports = _imports(name)
    assert not {m for m in imports if m.startswith("surgery.cli")}, f"{name} imports the CLI"
    assert not {m for m in imports if m.split(".")[0] in SCREEN}, f"{name} imports a screen library"


def test_every_module_lives_in_a_subpackage():
    """Top-level modules are only the package's own entry points."""
    top = {n for n, path in MODULES.items() if n.count(".") == 1 and path.name != "__init__.py"}
    assert top == {"surgery.__main__"}, sorted(top)
