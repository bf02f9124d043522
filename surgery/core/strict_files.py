"""Strict readers for every YAML and JSON text the tool reads: a key given twice in one mapping is an error.

PyYAML and the json module both keep the last of two equal keys without a word, so two recipes
pasted into one file bake only the second one's edits, and ``{alpha: 2, alpha: 3}`` bakes 3. Every
reader of the tool goes through :func:`load_yaml` / :func:`load_json` instead (a structure test
checks it), and a repeated key raises :class:`DuplicateKey` with the key and its lines. Each caller
turns that into its own one-line error (a recipe's, a findings file's, …) or, for caches, into a
miss. The YAML error is also a ``yaml.YAMLError`` and the JSON one a ``json.JSONDecodeError``, so a
handler written for malformed text handles it too.

YAML numbers and booleans are read only in the forms that mean one thing (:data:`_PLAIN`): YAML 1.1,
PyYAML's default, reads ``010`` as octal 8, ``1:30`` as base 60 (90), ``1_0`` as 10 and ``yes`` as
true, so ``neuron: 010`` baked neuron 8. Those forms arrive as strings, which the recipe's parsers
refuse, saying why (:func:`number_trap`). :func:`dump_yaml` quotes every string that either reading
would take for a number, so what the tool writes reads back the same in both.
"""

from __future__ import annotations

import json
import re
from json.decoder import JSONObject, scanstring
from json.scanner import py_make_scanner
from typing import Any

import yaml
from yaml.constructor import ConstructorError

_MERGE_TAG = "tag:yaml.org,2002:merge"
_BOOL, _INT, _FLOAT = (f"tag:yaml.org,2002:{kind}" for kind in ("bool", "int", "float"))
_DIGITS = "-+0123456789"

# tag: (pattern, first characters). YAML 1.2's core schema without its octal/hex forms and without
# leading zeros: every number here means the same in YAML 1.1 and 1.2, and in decimal.
_PLAIN = {
    _BOOL: (re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), "tTfF"),
    _INT: (re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), _DIGITS),
    _FLOAT: (
        re.compile(
            r"""^(?:[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?
            |[-+]?[0-9]+[eE][-+]?[0-9]+
            |[-+]?\.(?:inf|Inf|INF)
            |\.(?:nan|NaN|NAN))$""",
            re.X,
        ),
        _DIGITS + ".",
    ),
}


class DuplicateKey(ValueError):
    """A mapping gives ``key`` twice: first at line ``first_line``, again at ``line`` (1-based)."""

    key: Any
    line: int
    first_line: int

    def _remember(self, key: Any, line: int, first_line: int) -> None:
        self.key, self.line, self.first_line = key, line, first_line

    @property
    def what(self) -> str:
        """``key 'alpha' appears twice in one mapping (lines 3 and 7)``: the part every message shares."""
        where = (
            f"twice on line {self.line}"
            if self.line == self.first_line
            else f"twice in one mapping (lines {self.first_line} and {self.line})"
        )
        return f"key {self.key!r} appears {where}"


class YAMLDuplicateKey(DuplicateKey, ConstructorError):
    """A YAML mapping repeats a key."""

    def __init__(self, key: Any, first: yaml.Mark, second: yaml.Mark) -> None:
        ConstructorError.__init__(self, "while constructing a mapping", first, f"found duplicate key {key!r}", second)
        self._remember(key, second.line + 1, first.line + 1)

    def __str__(self) -> str:
        return self.what


class JSONDuplicateKey(DuplicateKey, json.JSONDecodeError):
    """A JSON object repeats a key."""

    def __init__(self, key: str, doc: str, first: int, second: int) -> None:
        json.JSONDecodeError.__init__(self, f"duplicate key {key!r}", doc, second)
        self._remember(key, doc.count("\n", 0, second) + 1, doc.count("\n", 0, first) + 1)

    def __str__(self) -> str:
        return self.what


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader with mappings that refuse a repeated key."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # Only the mapping's own keys: a key brought in by a merge (<<: *anchor) may be overridden.
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:
                continue  # an unhashable key: the safe loader itself refuses it below
            if first is not key_node.start_mark:
                raise YAMLDuplicateKey(key, first, key_node.start_mark)
        return super().construct_mapping(node, deep)


# Numbers and booleans only in their plain forms (see the module's docstring).
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _PLAIN]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _tag, (_regexp, _first) in _PLAIN.items():
    _StrictLoader.add_implicit_resolver(_tag, _regexp, list(_first))


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, which also quotes a string that :func:`load_yaml` reads as a float (``1e5``)."""


_Dumper.add_implicit_resolver(_FLOAT, _PLAIN[_FLOAT][0], list(_PLAIN[_FLOAT][1]))


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, refusing a repeated key (:class:`YAMLDuplicateKey`), with numbers
    and booleans read only in their plain forms (``010``, ``1:30``, ``1_0``, ``yes`` stay strings)."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass


def dump_yaml(data: Any, allow_unicode: bool = True) -> str:
    """``yaml.safe_dump(data, sort_keys=False)`` that :func:`load_yaml` and YAML 1.1 both read back as ``data``."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=allow_unicode)


# Forms of a number that load_yaml keeps as text, each with why (and what YAML 1.1 makes of it).
_TRAPS = (
    (re.compile(r"^[-+]?0[xXoObB][0-9a-fA-F_]+$"), "{prefix} marks another base: write it in decimal{read}"),
    (re.compile(r"^[-+]?0[0-9_]+$"), "a leading zero means octal in YAML 1.1{read}: drop the leading zeros"),
    (
        re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$"),
        "YAML 1.1 reads colons as base 60{read}: write one decimal number",
    ),
    (
        re.compile(r"^(?=.*_)[-+]?[0-9.][0-9_.]*(?:[eE][-+]?[0-9]+)?$"),
        "YAML 1.1 drops underscores{read}: leave them out",
    ),
    (re.compile(r"^(?:yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF)$"), "YAML 1.1 reads it as a boolean{read}"),
)


def number_trap(value: Any) -> str | None:
    """Why ``value``, text that looks like a number or boolean, is not one in a file read by
    :func:`load_yaml` (``"a leading zero means octal in YAML 1.1 (8): drop the leading zeros"``);
    None for any other value."""
    if not isinstance(value, str):
        return None
    for pattern, reason in _TRAPS:
        if pattern.match(value):
            read = f" ({int(value, 0)})" if value.lstrip("+-")[1:2] in "xXoObB" else _yaml11_reading(value)
            return reason.format(prefix=value.lstrip("+-")[:2], read=read)
    return None


def _yaml11_reading(text: str) -> str:
    """`` (8)``: what PyYAML's default loader reads ``text`` as, when that is a number or boolean."""
    tags = {tag for tag, regexp in yaml.SafeLoader.yaml_implicit_resolvers.get(text[:1], []) if regexp.match(text)}
    if not tags & set(_PLAIN):
        return ""
    return f" ({yaml.load(text, Loader=yaml.SafeLoader)!r})"  # noqa: S506 - the safe loader, on one scalar


class _Repeated(Exception):
    """Raised inside the fast parse; :func:`_locate` then finds the key and its lines."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Repeated
    return obj


def load_json(text: str | bytes) -> Any:
    """``json.loads(text)``, refusing a key repeated in one object (:class:`JSONDuplicateKey`)."""
    try:
        return json.loads(text, object_pairs_hook=_unique)
    except _Repeated:
        doc = text.decode(json.detect_encoding(text)) if isinstance(text, (bytes, bytearray)) else text
        raise _locate(doc) from None


def _locate(doc: str) -> JSONDuplicateKey:
    """Parse ``doc`` again, slowly and keeping offsets, to say on which lines the first repeat is.

    Only a failing read pays for it: the fast parse (C scanner) cannot report where a key was.
    """
    decoder = json.JSONDecoder()
    plain = decoder.scan_once  # values between the keys: any duplicate in them was found first

    def parse_object(s_and_end, strict, scan_once, object_hook, object_pairs_hook, memo=None):
        s, start = s_and_end
        obj, end = JSONObject(s_and_end, strict, scan_once, object_hook, None, memo)
        offsets: dict[str, int] = {}
        for key, at in _key_offsets(s, start, plain):
            if key in offsets:
                raise JSONDuplicateKey(key, s, offsets[key], at)
            offsets[key] = at
        return obj, end

    decoder.parse_object = parse_object
    decoder.scan_once = py_make_scanner(decoder)
    try:
        decoder.decode(doc)
    except JSONDuplicateKey as found:
        return found
    raise AssertionError("the fast parse found a repeated key that the slow one does not")


def _key_offsets(s: str, pos: int, scan_value) -> list[tuple[str, int]]:
    """(key, offset of its opening quote) of the object whose body starts at ``pos`` (after '{')."""

    def skip(i: int) -> int:
        while s[i] in " \t\r\n":
            i += 1
        return i

    keys, pos = [], skip(pos)
    while s[pos] == '"':
        at = pos
        key, pos = scanstring(s, pos + 1)
        keys.append((key, at))
        pos = skip(skip(pos) + 1)  # the ':'
        _, pos = scan_value(s, pos)
        pos = skip(pos)
        if s[pos] == ",":
            pos = skip(pos + 1)
    return keys
