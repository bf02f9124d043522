"""The house as drawn from its imports: packages in ranks, no circles, the command line on top.

Every ``import`` of every module under surgery/ counts, also those inside functions (a lazy import
is still a dependency). Each package of surgery/ has a rank (``RANKS``), and a module imports only
from its own rank or below. The order is the one the code needs:

- ``core`` (names, geometry, edits, checkpoints, files, prompts) needs no other package. It holds
  what several packages above share: the byte patches of a stored tensor (core/patches.py, planned
  by the bake and by every format), the card's before/after table (core/evaluation_table.py, made
  by the evaluation, kept by the bake's record), the eval result file (core/evaluation_result.py,
  written by the evaluation, read by the card and the report), the caveats of a heads finding's
  numbers (core/heads_caveats.py, quoted by the finder's tables and the bake's card) and a Hub
  repo id's pattern (core/hub_id.py).
- ``gguf`` reads GGUF files' bytes, with core alone; so loading a model may open one.
- ``model`` (loading, placement, run-time twins) opens checkpoints of every format, through the
  format object core's checkpoint answers with (``Checkpoint.format``, core/stored_format.py), and
  checks that a config describes its weights before transformers loads them (model/loadable.py).
- ``formats`` are the plug-ins behind that base: each plans its exact bytes with core's byte
  patches and holds its weights with model's holding code, and registers itself on import; only
  the door (``surgery/__init__``) imports them, so everything else calls them without knowing them.
- ``evaluation`` measures a model; it names a bake it measured by the weights' sha256 its container
  reads from the bake's record (``Container.recorded_weights``), without importing the bake.
- ``find`` measures awareness with evaluation's DiffAware/CtxtAware.
- ``bake`` writes a recipe into a checkpoint (or an exact LoRA adapter) and renders its card (each
  container its own: ``Container.card``; the card's "Why" shows a heads summary with its caveats,
  without importing find); nothing below it imports it, so neither a finder nor an evaluation
  depends on how a bake is written (the recipe is the bake's whole input; the card's evaluation
  table is handed to it).
- ``ship`` (an evaluation onto a card, reports, push) reads bakes, findings and eval results;
  ``api`` runs the commands; ``cli`` parses and prints; ``surgery`` itself (``__init__``,
  ``__main__``) is the door.

The tests keep the same order: they mirror the package folder for folder and share helpers through
tests/support/ only, never by importing one another.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from tests.support.paths import REPO, TESTS

PACKAGE = REPO / "surgery"
SCREEN = ("click", "rich")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _statements(path: Path, package: str) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, names taken from it) of every import in ``path``; relative ones resolved in ``package``."""
    found: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target, [alias.name for alias in node.names]))
    return found


def _import_lines(name: str) -> list[tuple[int, str]]:
    """(line, absolute name) of everything module ``name`` imports (modules of surgery and third parties)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for line, target, names in _statements(path, package):
        found.append((line, target))
        # `from . import hooks`: the names may be modules themselves
        found += [(line, f"{target}.{n}") for n in names if f"{target}.{n}" in MODULES]
    return found


def _imports(name: str) -> set[str]:
    """Absolute names of everything module ``name`` imports (modules of surgery and third parties)."""
    return {target for _, target in _import_lines(name)}


def _ancestor(package: str, name: str) -> bool:
    return name.startswith(package + ".")


def _depends(name: str, target: str) -> bool:
    """Whether importing ``target`` makes ``name`` depend on it: a module of surgery other than
    itself and its parent packages (``from .. import __version__`` is how Python runs, not a circle)."""
    return target in MODULES and target != name and not _ancestor(target, name)


GRAPH = {name: {m for m in _imports(name) if _depends(name, m)} for name in MODULES}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph``, or None (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circles():
    cycle = _cycle(GRAPH)
    assert cycle is None, " → ".join(cycle or [])


# --- packages in ranks ------------------------------------------------------------------------------

# A module imports from its own package's rank or below (the module docstring says why this order).
ENTRY = "surgery"  # surgery/__init__.py (the library's names) and surgery/__main__.py (the command)
RANKS = {
    "core": 0,
    "gguf": 1,
    "model": 2,
    "formats": 3,
    "evaluation": 4,
    "find": 5,
    "bake": 6,
    "ship": 7,
    "api": 8,
    "cli": 9,
    ENTRY: 10,
}
# Below the command line: these never import it, nor a screen library.
LIBRARY = tuple(f"surgery.{package}" for package in RANKS if package not in ("cli", ENTRY))
# Imports that go up the ranks anyway, as (package, package it imports): none. An entry needs a
# reason written beside it, and test_every_upward_exception_still_happens drops it once it is gone.
UPWARD_EXCEPTIONS: set[tuple[str, str]] = set()
# Distinct package → package imports (the entry points' own not counted): the number only goes down.
MAX_PACKAGE_EDGES = 25


def _package(module: str) -> str:
    """The package of surgery/ that ``module`` belongs to (``ENTRY`` for the top-level modules)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else ENTRY


def _unranked(modules: Iterable[str], ranks: Mapping[str, int]) -> list[str]:
    """Packages of ``modules`` that ``ranks`` does not rank."""
    return sorted({_package(m) for m in modules} - set(ranks))


def _upward(
    lines: Mapping[str, Iterable[tuple[int, str]]], ranks: Mapping[str, int], allowed: set[tuple[str, str]]
) -> list[str]:
    """One line per import in ``lines`` (module → its (line, module imported)) that goes to a higher rank."""
    found = []
    for name, imported in sorted(lines.items()):
        for line, target in imported:
            edge = (_package(name), _package(target))
            if ranks[edge[0]] < ranks[edge[1]] and edge not in allowed:
                path = MODULES[name].relative_to(REPO).as_posix() if name in MODULES else name
                found.append(
                    f"{path}:{line}: {name} ({edge[0]}, rank {ranks[edge[0]]}) imports {target} "
                    f"({edge[1]}, rank {ranks[edge[1]]})"
                )
    return found


def _package_graph(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` with its modules gathered into their packages (a package's imports of itself left out)."""
    packages: dict[str, set[str]] = {_package(name): set() for name in graph}
    for name, imported in graph.items():
        packages[_package(name)] |= {_package(m) for m in imported} - {_package(name)}
    return packages


PACKAGE_GRAPH = _package_graph(GRAPH)
SURGERY_LINES = {name: [(line, m) for line, m in _import_lines(name) if _depends(name, m)] for name in MODULES}


def test_every_package_has_a_rank():
    missing = _unranked(MODULES, RANKS)
    assert not missing, f"surgery/{missing[0]}/ has no rank: give it one in RANKS (tests/core/test_structure.py)"


def test_imports_go_down_the_ranks():
    """Lazy imports too: a function-level import is the same dependency, only later."""
    offenders = _upward(SURGERY_LINES, RANKS, UPWARD_EXCEPTIONS)
    assert not offenders, "an import goes up the ranks (move the piece to the package that owns it):\n" + "\n".join(
        offenders
    )


def test_every_upward_exception_still_happens():
    gone = sorted(edge for edge in UPWARD_EXCEPTIONS if edge[1] not in PACKAGE_GRAPH.get(edge[0], set()))
    assert not gone, f"{gone}: no longer imported; remove them from UPWARD_EXCEPTIONS"


def test_no_circles_between_packages():
    """Besides the upward exceptions (each would close a circle)."""
    cycle = _cycle({a: {b for b in targets if (a, b) not in UPWARD_EXCEPTIONS} for a, targets in PACKAGE_GRAPH.items()})
    assert cycle is None, " → ".join(cycle or [])


def test_packages_import_few_others():
    edges = sorted((a, b) for a, targets in PACKAGE_GRAPH.items() if a != ENTRY for b in targets)
    print(f"{len(edges)} package edges:", ", ".join(f"{a}→{b}" for a, b in edges))
    assert len(edges) <= MAX_PACKAGE_EDGES, (
        f"{len(edges)} package → package imports, at most {MAX_PACKAGE_EDGES}: "
        + ", ".join(f"{a}→{b}" for a, b in edges)
    )


def test_the_command_line_reads_only_the_library_and_core():
    """cli parses and prints: what it needs of the packages below comes through surgery.api
    (api/params.py: option objects, api/records.py: records and their readings)."""
    assert PACKAGE_GRAPH["cli"] <= {"api", "core"}, sorted(PACKAGE_GRAPH["cli"] - {"api", "core"})


def test_the_rank_checks_catch_what_they_should():
    """On a made-up house: an import up the ranks is named with its line unless allowed, one down
    is not, a package without a rank is found, and a circle between packages is found."""
    ranks = {"core": 0, "model": 1}
    up = {"surgery.core.x": [(3, "surgery.model.y")], "surgery.model.y": [(7, "surgery.core.x")]}
    assert _upward(up, ranks, set()) == [
        "surgery.core.x:3: surgery.core.x (core, rank 0) imports surgery.model.y (model, rank 1)"
    ]
    assert _upward(up, ranks, {("core", "model")}) == []
    assert _unranked(["surgery.core.x", "surgery.bake.z", "surgery"], ranks) == ["bake", ENTRY]
    circle = _package_graph({"surgery.core.x": {"surgery.model.y"}, "surgery.model.y": {"surgery.core.w"}})
    assert _cycle(circle) == ["core", "model", "core"]
    assert _cycle(_package_graph({"surgery.model.y": {"surgery.core.x"}, "surgery.core.x": set()})) is None


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
    return {m for _, target, names in _statements(path, package) for m in (target, *(f"{target}.{n}" for n in names))}


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


# A module says one thing: past this many lines it says two, and one goes to its own module.
MAX_LINES = 450
# Modules still past it (the list only shrinks: a module that comes back under leaves it).
STILL_LONG = {"surgery/bake/verify.py"}


def test_modules_stay_short():
    lengths = {path.relative_to(REPO).as_posix(): len(path.read_text().splitlines()) for path in MODULES.values()}
    long = {name for name, n in lengths.items() if n > MAX_LINES}
    assert long <= STILL_LONG, "split one responsibility out of: " + ", ".join(
        f"{name} ({lengths[name]} lines)" for name in sorted(long - STILL_LONG)
    )
    assert long >= STILL_LONG, f"back under {MAX_LINES} lines, drop from STILL_LONG: {sorted(STILL_LONG - long)}"
