"""A key given twice in one mapping is refused by every YAML and JSON reader of the tool, with the key
and its lines: PyYAML and json keep the last one silently, so two recipes pasted into one file baked
only the second one's edits."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from surgery.core.errors import SurgeryError
from surgery.core.strict_files import DuplicateKey, dump_yaml, load_json, load_yaml, number_trap
from tests.support.paths import REPO

PACKAGE = REPO / "surgery"
STRICT = PACKAGE / "core" / "strict_files.py"
# optional.py names the package missing from a partial install and reads pip's own install record
# (direct_url.json) to say how to reinstall: it must work when yaml (which strict_files needs) is missing.
OWN_RECORDS = {PACKAGE / "core" / "optional.py"}
# The readers that keep the last of two equal keys; only strict_files may call them.
LENIENT = {
    ("json", "load"),
    ("json", "loads"),
    ("yaml", "load"),
    ("yaml", "safe_load"),
    ("yaml", "full_load"),
    ("yaml", "unsafe_load"),
    ("yaml", "load_all"),
    ("yaml", "safe_load_all"),
}


def test_every_reader_of_the_tool_is_strict():
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == STRICT or path in OWN_RECORDS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            func = node.func if isinstance(node, ast.Call) else None
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and (func.value.id, func.attr) in LENIENT
            ):
                calls.append(f"{path.relative_to(REPO)}:{node.lineno} {func.value.id}.{func.attr}")
    assert not calls, "read YAML/JSON with surgery.core.strict_files instead: " + ", ".join(calls)


@pytest.mark.parametrize(
    "text, key, lines",
    [
        ("version: 1\nedits: [1]\nversion: 1\nedits: [2]\n", "version", (1, 3)),  # two recipes in one file
        ("edits:\n  - {type: head, alpha: 2, alpha: 3}\n", "alpha", (2, 2)),  # inside a list entry
        ("a:\n  b: 1\n  c:\n    d: 1\n    d: 2\n", "d", (4, 5)),  # nested
        ("1: x\n1.0: y\n", 1.0, (1, 2)),  # equal as values
    ],
)
def test_yaml_refuses_a_repeated_key_with_its_lines(text, key, lines):
    with pytest.raises(DuplicateKey) as caught:
        load_yaml(text)
    assert caught.value.key == key and (caught.value.first_line, caught.value.line) == lines
    assert isinstance(caught.value, yaml.YAMLError)  # handlers of malformed YAML catch it too
    assert "\n" not in str(caught.value) and repr(key) in str(caught.value)


@pytest.mark.parametrize(
    "text, key, lines",
    [
        ('{"a": 1,\n "b": 2,\n "a": 3}', "a", (1, 3)),
        ('[{"a": 1}, {"b": {"x": 1,\n\n "x": 2}}]', "x", (1, 3)),
        ('{"k": [1, {"z": 1}], "k": 3}', "k", (1, 1)),
        ('{"\\u0061": 1,\n "a": 2}', "a", (1, 2)),  # the same key spelled with an escape
    ],
)
def test_json_refuses_a_repeated_key_with_its_lines(text, key, lines):
    for given_as in (text, text.encode()):
        with pytest.raises(DuplicateKey) as caught:
            load_json(given_as)
        assert caught.value.key == key and (caught.value.first_line, caught.value.line) == lines
        assert isinstance(caught.value, json.JSONDecodeError) and caught.value.lineno == lines[1]


def test_merge_keys_may_be_overridden():
    """``<<: *base`` then an explicit key is YAML's way to override: not a repeat."""
    assert load_yaml("base: &b {alpha: 2, layer: 1}\nedit:\n  <<: *b\n  alpha: 3\n")["edit"] == {"alpha": 3, "layer": 1}


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(_values)
def test_without_repeats_the_strict_readers_read_what_the_usual_ones_read(value):
    text = json.dumps(value, indent=1)
    assert load_json(text) == json.loads(text)
    text = dump_yaml(value, allow_unicode=False)  # what the tool writes reads back the same in YAML 1.1
    assert load_yaml(text) == yaml.safe_load(text) == value


# --- numbers mean what they say in decimal (issue 33: `neuron: 010` baked neuron 8) ------------------


@pytest.mark.parametrize(
    "text, yaml11, trap",
    [
        ("010", 8, "a leading zero means octal in YAML 1.1 (8): drop the leading zeros"),
        ("-007", -7, "a leading zero means octal in YAML 1.1 (-7)"),
        ("09", "09", "a leading zero means octal in YAML 1.1: drop"),  # not even octal: YAML 1.1 keeps text
        ("1:30", 90, "YAML 1.1 reads colons as base 60 (90)"),
        ("1:30.5", 90.5, "base 60 (90.5)"),
        ("0x10", 16, "0x marks another base: write it in decimal (16)"),
        ("0o10", "0o10", "0o marks another base: write it in decimal (8)"),
        ("0b11", 3, "write it in decimal (3)"),
        ("1_0", 10, "YAML 1.1 drops underscores (10): leave them out"),
        ("1_000.5", 1000.5, "drops underscores (1000.5)"),
        ("yes", True, "YAML 1.1 reads it as a boolean (True)"),
        ("Off", False, "a boolean (False)"),
    ],
)
def test_ambiguous_numbers_stay_text_and_say_why(text, yaml11, trap):
    assert yaml.safe_load(f"k: {text}")["k"] == yaml11  # what PyYAML's default reads
    read = load_yaml(f"k: {text}")["k"]
    assert read == text and trap in number_trap(read)


@pytest.mark.parametrize(
    "text, value",
    [("10", 10), ("-3", -3), ("+0", 0), ("0", 0), ("2.5", 2.5), ("1e30", 1e30), ("-2E-3", -2e-3), (".5", 0.5)]
    + [("1.0e+30", 1e30), ("true", True), ("False", False), (".inf", float("inf")), ("~", None), ("null", None)],
)
def test_plain_numbers_and_booleans_read_as_themselves(text, value):
    assert load_yaml(f"k: {text}")["k"] == value
    assert number_trap(text) is None


@pytest.mark.parametrize("text", ["1e5", "010", "1:30", "yes", "0x1F", "1_0", "2.5"])
def test_dump_quotes_text_that_either_yaml_reads_as_a_number(text):
    written = dump_yaml({"k": text})
    assert load_yaml(written) == yaml.safe_load(written) == {"k": text}, written


# --- each reader says which file, which key and what to do, in one line -----------------------------


def _pairs(tmp_path: Path) -> Path:
    from tests.support.neuron_pairs import write_pairs

    path = tmp_path / "pairs.jsonl"
    write_pairs(path)
    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace('"language": "en"', '"language": "en", "language": "es"')
    path.write_text("\n".join(lines) + "\n")
    return path


def _benchmark(tmp_path: Path) -> Path:
    from tests.support.binding import write_small_benchmark

    path = write_small_benchmark(tmp_path / "bench.jsonl")
    lines = path.read_text().splitlines()
    lines[2] = '{"kind": "x", ' + lines[2][1:]
    path.write_text("\n".join(lines) + "\n")
    return path


def _bbq(tmp_path: Path) -> Path:
    path = tmp_path / "bbq.jsonl"
    path.write_text('{"context_condition": "ambig"}\n{"label": 1, "label": 2}\n')
    return path


def _eval_result(tmp_path: Path) -> Path:
    path = tmp_path / "eval.json"
    path.write_text('{"format": "surgery-eval",\n "version": 1,\n "metrics": {},\n "version": 1}\n')
    return path


def _findings(tmp_path: Path) -> Path:
    path = tmp_path / "f.json"
    path.write_text(
        '{"format": "surgery-findings", "version": 1, "kind": "heads",\n'
        ' "selected_heads": [[0, 1]],\n "selected_heads": [[0, 2]]}\n'
    )
    return path


def _provenance(tmp_path: Path) -> Path:
    (tmp_path / "surgery.json").write_text('{"format": "surgery-checkpoint",\n "recipe": {},\n "recipe": {}}\n')
    return tmp_path


def _read(name: str):
    from surgery.bake.provenance import load_provenance
    from surgery.core.evaluation_result import load_result
    from surgery.evaluation.data import read_jsonl
    from surgery.find.findings import load_findings
    from surgery.find.heads.benchmark import load_benchmark
    from surgery.find.neurons.pairs import load_pairs
    from surgery.ship.report import read_findings

    return {
        "pairs": lambda p: load_pairs(str(p)),
        "benchmark": load_benchmark,
        "bbq": lambda p: read_jsonl(p, "BBQ"),
        "eval-result": load_result,
        "findings": lambda p: load_findings(p, "heads"),
        "report-findings": read_findings,
        "provenance": load_provenance,
    }[name]


@pytest.mark.parametrize(
    "name, write, needles",
    [
        ("pairs", _pairs, ("pairs.jsonl line 2: 'language' is given twice", "keep one")),
        ("benchmark", _benchmark, ("bench.jsonl line 3: 'kind' is given twice", "keep one")),
        ("bbq", _bbq, ("bbq.jsonl:2: 'label' is given twice", "keep one")),
        ("eval-result", _eval_result, ("key 'version' appears twice in one mapping (lines 2 and 4)", "rerun")),
        ("findings", _findings, ("key 'selected_heads' appears twice in one mapping (lines 2 and 3)", "recompute")),
        ("report-findings", _findings, ("key 'selected_heads' appears twice", "recompute")),
        ("provenance", _provenance, ("key 'recipe' appears twice in one mapping (lines 2 and 3)", "bake again")),
    ],
)
def test_each_reader_names_the_file_the_key_and_the_fix(tmp_path, name, write, needles):
    with pytest.raises(SurgeryError) as caught:
        _read(name)(write(tmp_path))
    message = str(caught.value)
    assert "\n" not in message and all(n in message for n in needles), message
