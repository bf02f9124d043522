"""The documentation says what the code does: generated pages are current, links resolve inside
the repository, and every command line the docs show names real commands and options."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import click
import pytest
import yaml

from tests.support.paths import REPO

DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
READ = [REPO / "README.md", *PAGES]  # what a user reads


def _generator():
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cli() -> click.Group:
    from surgery.cli.group import cli, register_all

    register_all()
    return cli


def _repository_files() -> list[Path]:
    try:
        names = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the repository's file list needs git: {exc}")
    return [REPO / n for n in names if (REPO / n).is_file()]


def test_generated_pages_are_what_the_code_generates_now():
    stale = _generator().stale()
    assert not stale, f"run `python docs/generate.py`: {', '.join('docs/' + p for p in stale)} differ from the code"


def test_every_field_of_a_row_has_its_docstring_in_the_contributor_page():
    """The field tables of adding-an-architecture.md hold every field of Layout, its parts, its experts' parts
    and records."""
    import dataclasses

    from surgery.core.architectures import experts, layout

    generator = _generator()
    page = (DOCS / "contributing/adding-an-architecture.md").read_text(encoding="utf-8")
    parts = [type(getattr(layout.Layout(), f.name)) for f in dataclasses.fields(layout.Layout) if f.name != "experts"]
    expert_parts = (experts.ExpertKeys, experts.ExpertWeights, experts.SharedExpert, experts.SparseLayers)
    for cls in (layout.Layout, *parts, experts.Experts, *expert_parts, experts.StepRule):
        docs = generator.field_docs(cls)
        assert set(docs) == {f.name for f in dataclasses.fields(cls)}, cls.__name__
        assert f"### `{cls.__name__}`" in page
        for name, doc in docs.items():
            assert f"| `{name}` |" in page and " ".join(doc.split()).replace("|", "\\|") in page


def test_a_field_without_a_docstring_stops_the_generator():
    """A part whose field has no docstring cannot be written into the page: the generator names it."""
    import dataclasses

    generator = _generator()

    @dataclasses.dataclass(frozen=True)
    class Part:
        documented: int = 0
        """What it says."""
        bare: int = 1

    assert generator.field_docs(Part) == {"documented": "What it says."}
    with pytest.raises(SystemExit, match="Part: fields without a docstring: bare"):
        generator._fields_table(Part)


def test_a_generated_part_is_spliced_between_its_markers(tmp_path, monkeypatch):
    """Only the text between the markers is written; a page without them is refused in one line."""
    generator = _generator()
    monkeypatch.setattr(generator, "DOCS", tmp_path)
    begin, end = generator.BEGIN.format(source="src"), generator.END
    (tmp_path / "page.md").write_text(f"# Title\n\n{begin}\n\nold\n\n{end}\n\nafter\n", encoding="utf-8")
    assert generator._spliced("page.md", "src", "new\n") == f"# Title\n\n{begin}\n\nnew\n\n{end}\n\nafter\n"
    (tmp_path / "bare.md").write_text("# Title\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="docs/bare.md needs one line"):
        generator._spliced("bare.md", "src", "new\n")


def test_nothing_points_at_files_outside_the_repository():
    """No file cites the design brief that lives outside the repository, and no page links there."""
    cites = re.compile(rb"PAPERS\.md")
    citing = [str(p.relative_to(REPO)) for p in _repository_files() if cites.search(p.read_bytes())]
    assert not citing, f"cite docs/methods/ or the paper instead: {citing}"
    outside = re.compile(r"\.\./shared")
    linking = [str(p.relative_to(REPO)) for p in [*READ, REPO / "mkdocs.yml"] if outside.search(p.read_text())]
    assert not linking, linking


LINK = re.compile(r"\]\(([^)\s]+)\)")


def _local_links(path: Path) -> list[str]:
    """Relative link targets of a markdown file, code blocks and spans left out."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


@pytest.mark.parametrize("path", READ, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve_inside_the_repository(path):
    for target in _local_links(path):
        resolved = (path.parent / target.split("#")[0]).resolve()
        assert resolved.is_relative_to(REPO), f"{target} leaves the repository"
        assert resolved.exists(), f"{path.name}: {target} does not exist"


def test_every_page_is_in_the_site_navigation():
    def pages(nav) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        items = nav.values() if isinstance(nav, dict) else nav
        return [p for item in items for p in pages(item)]

    listed = pages(yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"])
    assert sorted(listed) == sorted(str(p.relative_to(DOCS)) for p in PAGES)


def _code(path: Path) -> list[str]:
    """Code lines of a markdown file (fenced blocks but Python ones, continuation lines joined) and code spans."""
    text = path.read_text(encoding="utf-8")
    blocks = [body for lang, body in re.findall(r"```([^\n]*)\n(.*?)```", text, flags=re.S) if lang.strip() != "python"]
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return lines + re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))


def _shown_commands() -> list[tuple[str, str, list[str]]]:
    """(file, command, its --options) for every `surgery COMMAND …` the docs show."""
    found = []
    for path in READ:
        for line in _code(path):
            line = line.split(" # ")[0]
            for match in re.finditer(r"\bsurgery\s+(?:--debug\s+)?([a-z][a-z0-9-]*)(.*)", line):
                found.append((path.name, match.group(1), re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", match.group(2))))
    return found


def test_every_command_line_in_the_docs_is_one_the_cli_accepts():
    cli = _cli()
    shown = _shown_commands()
    assert len(shown) > 40  # the scan sees the docs' command lines
    for page, name, flags in shown:
        assert name in cli.commands, f"{page}: surgery {name} is not a command"
        known = {o for p in cli.commands[name].params for o in (*p.opts, *getattr(p, "secondary_opts", ()))}
        unknown = sorted(set(flags) - known - {"--help"})
        assert not unknown, f"{page}: surgery {name} has no option {unknown}"


def test_every_quickstart_flag_in_the_docs_exists():
    script = (REPO / "examples" / "quickstart.sh").read_text(encoding="utf-8")
    accepted = set(re.findall(r"^\s+(--[a-z-]+)(?:\|[^)]*)?\)", script, flags=re.M))
    assert {"--install-only", "--torch-index", "--model", "--out"} <= accepted
    for path in READ:
        for line in _code(path):
            for match in re.finditer(r"examples/quickstart\.sh(.*)", line.split(" # ")[0]):
                flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", match.group(1)))
                assert flags <= accepted, f"{path.name}: quickstart.sh has no {sorted(flags - accepted)}"


def test_the_readme_says_which_commands_lack_json():
    cli = _cli()
    lacking = {name for name, c in cli.commands.items() if not any("--json" in p.opts for p in c.params)}
    text = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    claim = re.search(r"Every command except ((?:`[a-z-]+`(?:, | and )?)+) takes `--json`", text)
    assert claim, "the README no longer says which commands take --json"
    assert set(re.findall(r"`([a-z-]+)`", claim.group(1))) == lacking


def test_the_readme_gives_the_device_default_of_the_code():
    from surgery.model.loading import LoadSpec

    text = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    stated = re.findall(r"`--device [^`]*` \(default `([a-z:0-9]+)`", text)
    assert stated == [LoadSpec().device]


@pytest.mark.parametrize("command, model", [("verify", "SOURCE"), ("eval", "--against")])
def test_revision_help_says_whose_revision_in_a_two_model_command(command, model):
    """verify reads SOURCE and BAKED, eval MODEL and --against: the help says which one --revision is for."""
    (revision,) = [p for p in _cli().commands[command].params if "--revision" in getattr(p, "opts", ())]
    assert model in revision.help


def test_help_of_one_command_speaks_of_that_command_only():
    """--revision's help was one text for all: "of MODEL (verify: of SOURCE; eval's --against …)" in
    inspect's and every other command's help; each command now says whose revision it is."""
    cli = _cli()
    for name, command in cli.commands.items():
        for param in command.params:
            others = [o for o in cli.commands if o != name and re.search(rf"\b{o}(:|'s)", param.help or "")]
            assert not others, f"surgery {name} {param.opts[0]}'s help speaks of {others}: {param.help}"


def test_readme_counts_what_the_coverage_page_counts():
    """The README's one line of coverage numbers is the generated page's, not a copy that drifts."""
    from surgery.core.coverage import coverage

    rows = coverage()
    supported = sum(r.status == "supported" for r in rows)
    refused = sum(r.status == "refused" for r in rows)
    said = re.search(
        r"(\d+) model types supported with proof, (\d+) refused",
        " ".join((REPO / "README.md").read_text(encoding="utf-8").split()),
    )
    assert said, "README.md lost its line 'N model types supported with proof, M refused'"
    assert (int(said[1]), int(said[2])) == (supported, refused), "update the counts in README.md"


# "`--flag VALUE` (default)" and "`--flag` …, (default N" in the guides: the flag's default, as the
# guides state it beside the generated reference page (which test_generated_pages keeps to the code)
_CLAIMED = (
    re.compile(r"`(--[a-z][a-z0-9-]*) ([^`\s]+)` \(default\)"),
    re.compile(r"(?<!… )`(--[a-z][a-z0-9-]*)`[^`(0-9×]{0,30}?,? \(?default:? `?(-?[0-9][0-9.]*)(?![0-9.])"),
)
# "`--alpha-min` … `--alpha-max`, default 1 … 4"
_RANGE = re.compile(r"`(--[a-z][a-z0-9-]*)` … `(--[a-z][a-z0-9-]*)`, default (-?[0-9.]+) … (-?[0-9.]+)")


def _same(given: object, stated: str) -> bool:
    try:
        return float(given) == float(stated)
    except (TypeError, ValueError):
        return str(given) == stated


def test_defaults_the_guides_state_are_the_commands_defaults():
    """A guide's "(default 10)" beside a flag is the default of that flag in a command that has it (or
    the default its help states, for an option resolved when the command runs, e.g. --population)."""
    cli = _cli()
    claims = [
        (path.name, m[1], m[2])
        for path in READ
        if "reference" not in path.parts
        for pattern in _CLAIMED
        for m in pattern.finditer(" ".join(path.read_text(encoding="utf-8").split()))
    ] + [
        (path.name, m[1 + side], m[3 + side])
        for path in READ
        for m in _RANGE.finditer(" ".join(path.read_text(encoding="utf-8").split()))
        for side in (0, 1)
    ]
    assert len(claims) >= 12  # the scan sees the guides' defaults
    for page, flag, stated in claims:
        options = [p for c in cli.commands.values() for p in c.params if flag in getattr(p, "opts", ())]
        assert options, f"{page}: no command has {flag}"
        said = (
            _same(p.default, stated) or re.search(rf"\(default:? {re.escape(stated)}\b", p.help or "") for p in options
        )
        assert any(said), (
            f"{page}: {flag} (default {stated}) but its commands' defaults are {[p.default for p in options]}"
        )
