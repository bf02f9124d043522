"""The house as drawn from its imports: no circles, the command line on top, the library below it.

Every ``import`` of every module under surgery/ counts, also those inside functions (a lazy import
is still a dependency). The tests keep the same order: they mirror the package folder for folder and
share helpers through tests/support/ only, never by importing one another.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO, TESTS

PACKAGE = REPO / "surgery"
# Below the command line: these never import it, nor a screen library.
LIBRARY = (
    "surgery.api",
    "surgery.core",
    "surgery.model",
    "surgery.find",
    "surgery.bake",
    "surgery.evaluation",
    "surgery.ship",
)
SCREEN = ("click", "rich")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _statements(path: Path, package: str) -> list[tuple[str, list[str]]]:
    """(absolute module, names taken from it) of every import in ``path``; relative ones resolved in ``package``."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((target, [alias.name for alias in node.names]))
    return found


def _imports(name: str) -> set[str]:
    """Absolute names of everything module ``name`` imports (modules of surgery and third parties)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for target, names in _statements(path, package):
        found.add(target)
        # `from . import hooks`: the names may be modules themselves
        found |= {f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES}
    return found


def _ancestor(package: str, name: str) -> bool:
    return name.startswith(package + ".")


# A module importing its own parent package (``from . import x``) is how Python runs, not a circle.
GRAPH = {name: {m for m in _imports(name) if m in MODULES and m != name and not _ancestor(m, name)} for name in MODULES}


def _cycle() -> list[str] | None:
    """One import cycle among surgery's modules, or None (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
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


# Test folders that hold no tests of one package: shared helpers, the planted reference models and
# their data, and the checks of the documentation.
NOT_MIRRORED = ("support", "planted", "fixtures", "docs", "examples")  # examples: the scripts under examples/


def _imported_names(path: Path) -> set[str]:
    """Every module a file under tests/ imports, and every ``module.name`` of its from-imports."""
    package = ".".join(path.parent.relative_to(REPO).parts)
    return {m for target, names in _statements(path, package) for m in (target, *(f"{target}.{n}" for n in names))}


def _is_test_module(name: str) -> bool:
    """``tests.….test_x`` or ``tests.conftest``: a module of tests (or fixtures), not of helpers."""
    parts = name.split(".")
    return parts[0] == "tests" and (parts[-1].startswith("test_") or parts[-1] == "conftest")


def test_tests_share_helpers_through_support_only():
    """A helper imported from a test module drags that module's tests along; tests/support/ holds it."""
    imports = {
        path.relative_to(REPO).as_posix(): sorted(n for n in _imported_names(path) if _is_test_module(n))
        for path in sorted(TESTS.rglob("*.py"))
    }
    offenders = {path: names for path, names in imports.items() if names}
    assert not offenders, "move these helpers to tests/support/: " + "; ".join(
        f"{path} imports {', '.join(names)}" for path, names in offenders.items()
    )


def test_test_folders_mirror_the_package():
    """tests/<pkg>/test_*.py tests surgery/<pkg>: each test file sits in a folder the package has."""
    misplaced = []
    for path in sorted(TESTS.rglob("test_*.py")):
        folder = path.parent.relative_to(TESTS)
        if folder.parts and folder.parts[0] in NOT_MIRRORED:
            continue
        if not folder.parts or not (PACKAGE / folder).is_dir():  # tests/ itself mirrors no package
            misplaced.append(path.relative_to(REPO).as_posix())
    assert not misplaced, f"no surgery/ folder of that name: {misplaced}"
