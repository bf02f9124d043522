"""The cultural-binding benchmark: items, question stems, neutral items; our JSONL format and N4.

Two sources give the same :class:`Benchmark`:

- our own JSONL (``surgery/data/binding_*.jsonl``, or any file in the same format): one JSON object
  per line with a ``kind``:

  - ``{"kind": "template", "qtype": 0, "text": "... {item} ...", "equal": "Both should ..."}``
  - ``{"kind": "item", "item": "a hanbok", "culture": "Korean", "related": [...],
    "unrelated": [...], "qtypes": [0, 1, 2]}``
  - ``{"kind": "neutral", "qtype": 0, "item": "a rain jacket"}`` (items for "=" questions)

- the N4 JSONL of Wang et al. 2025 (``split``, ``question``, ``answer``, ``item``, ``related``, …):
  its "≠" questions become the stems, the related identities that appear as options become the
  items' identities (as in the reference code).

qtype: 0 wearing, 1 selling/profiting, 2 speaker/author selection, 3 casting.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ...core.errors import SurgeryError, not_a_file
from ...core.strict_files import DuplicateKey, load_json

QTYPES = {0: "wearing", 1: "selling", 2: "speaker", 3: "casting"}
BUILTIN_FILES = ("binding_templates.jsonl", "binding_items.jsonl", "binding_neutral.jsonl")
N4_FIELDS = ("split", "question", "answer", "item", "related", "unrelated", "qtype")
_ARTICLE = re.compile(r"^(a|an|the)\s+", re.IGNORECASE)
_OPTIONS = re.compile(r"\n\(a\) (?P<a>.+?) \(b\) (?P<b>.+?) \(c\) (?P<c>.+)\Z", re.DOTALL)


class BenchmarkError(SurgeryError):
    """A benchmark file is malformed or too small for the requested pairs."""


def strip_article(identity: str) -> str:
    """``"a Lakota tribal member"`` → ``"Lakota tribal member"``."""
    return _ARTICLE.sub("", identity.strip())


def norm_identity(identity: str) -> str:
    """The key two spellings of one identity share (article, case and spacing ignored)."""
    return " ".join(strip_article(identity).lower().split())


def display(identity: str) -> str:
    """How an identity is written as an option: ``"the <identity without article>"``."""
    return "the " + strip_article(identity)


@dataclass(frozen=True)
class Stem:
    """One question text before its options, with the item's character span inside it."""

    qtype: int
    text: str
    item_span: tuple[int, int] | None
    equal: str  # the equal-treatment option (c)


@dataclass(frozen=True)
class Item:
    """A cultural item, its related identities, and the stems that ask about it."""

    name: str
    related: tuple[str, ...]
    unrelated: tuple[str, ...]
    stems: tuple[Stem, ...]
    culture: str | None = None

    def related_keys(self) -> set[str]:
        return {norm_identity(r) for r in self.related}

    def conflicts(self, other: Item) -> bool:
        """Items that share an identity (or a declared culture) are never paired."""
        if self.culture is not None and self.culture == other.culture:
            return True
        return bool(self.related_keys() & other.related_keys())


@dataclass(frozen=True)
class Benchmark:
    """Items plus the sha256 of the bytes they were read from (findings record it)."""

    items: tuple[Item, ...]
    sha256: str
    source: str
    neutral: dict[int, tuple[str, ...]] = field(default_factory=dict)
    templates: dict[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    format: str = "surgery"  # or "n4"


def locate(text: str, phrase: str) -> tuple[int, int] | None:
    """Character span of ``phrase`` in ``text`` (whole words; then case-insensitive; then without
    its article), or None."""
    for candidate, flags in ((phrase, 0), (phrase, re.IGNORECASE), (strip_article(phrase), re.IGNORECASE)):
        if not candidate:
            continue
        m = re.search(r"(?<!\w)" + re.escape(candidate) + r"(?!\w)", text, flags)
        if m:
            return m.start(), m.end()
    return None


def split_options(question: str) -> tuple[str, str, str, str] | None:
    """``(stem, option a, option b, option c)`` of an N4-format question, or None."""
    m = _OPTIONS.search(question)
    if not m:
        return None
    return question[: m.start()], m["a"], m["b"], m["c"]


def _read_jsonl(data: bytes, where: str) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(data.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = load_json(line)
        except DuplicateKey as exc:
            raise BenchmarkError(f"{where} line {n}: {exc.key!r} is given twice in one row; keep one") from None
        except json.JSONDecodeError as exc:
            raise BenchmarkError(f"{where} line {n} is not JSON ({exc.msg}); fix the line") from None
        if not isinstance(row, dict):
            raise BenchmarkError(f"{where} line {n} must be a JSON object")
        rows.append(row)
    return rows


def _need(row: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = row.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BenchmarkError(f"{where}: '{key}' must be a {kind.__name__}, got {value!r}")
    return value


def _qtype(row: Mapping[str, Any], where: str) -> int:
    q = _need(row, "qtype", int, where)
    if q not in QTYPES:
        raise BenchmarkError(f"{where}: qtype must be one of {sorted(QTYPES)}, got {q}")
    return q


def _strings(row: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    values = _need(row, key, list, where)
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
        raise BenchmarkError(f"{where}: '{key}' must be a non-empty list of strings")
    return tuple(values)


def parse_own(rows: Iterable[Mapping[str, Any]], sha256: str, source: str) -> Benchmark:
    """Build a benchmark from rows of our JSONL format (see the module docstring)."""
    templates: dict[int, list[tuple[str, str]]] = {}
    neutral: dict[int, list[str]] = {}
    raw_items = []
    for n, row in enumerate(rows, 1):
        where = f"{source} record {n}"
        kind = row.get("kind")
        if kind == "template":
            text = _need(row, "text", str, where)
            if text.count("{item}") != 1:
                raise BenchmarkError(f"{where}: a template needs exactly one {{item}} placeholder")
            equal = _need(row, "equal", str, where)
            if "{item}" in equal:  # the equal option is shared with the neutral "=" questions
                raise BenchmarkError(f"{where}: the 'equal' option must not name the item")
            templates.setdefault(_qtype(row, where), []).append((text, equal))
        elif kind == "neutral":
            neutral.setdefault(_qtype(row, where), []).append(_need(row, "item", str, where))
        elif kind == "item":
            qtypes = _need(row, "qtypes", list, where)
            if not qtypes or any(q not in QTYPES for q in qtypes):
                raise BenchmarkError(f"{where}: qtypes must list some of {sorted(QTYPES)}")
            raw_items.append(
                (
                    where,
                    _need(row, "item", str, where),
                    _strings(row, "related", where),
                    _strings(row, "unrelated", where),
                    tuple(qtypes),
                    row.get("culture"),
                )
            )
        else:
            raise BenchmarkError(f"{where}: kind must be 'template', 'item' or 'neutral', got {kind!r}")
    items = []
    for where, name, related, unrelated, qtypes, culture in raw_items:
        stems = []
        for q in qtypes:
            if q not in templates:
                raise BenchmarkError(f"{where}: no template of qtype {q}; add one or drop it from qtypes")
            for text, equal in templates[q]:
                start = text.index("{item}")
                stem = text.replace("{item}", name)
                stems.append(Stem(q, stem, (start, start + len(name)), equal))
        items.append(Item(name, related, unrelated, tuple(stems), culture))
    return Benchmark(
        tuple(items),
        sha256,
        source,
        {q: tuple(v) for q, v in neutral.items()},
        {q: tuple(v) for q, v in templates.items()},
    )


def load_n4(path: str | Path) -> list[dict[str, Any]]:
    """The N4 JSONL records (fields: split, question, answer, unique_id, qtype, item, related,
    unrelated), checked; the file itself is never copied."""
    path = Path(path)
    if not path.is_file():
        raise BenchmarkError(f"N4 file {path} does not exist; point to difference_awareness/N4_1k.jsonl")
    rows = _read_jsonl(path.read_bytes(), str(path))
    for n, row in enumerate(rows, 1):
        missing = [k for k in N4_FIELDS if k not in row]
        if missing:
            raise BenchmarkError(f"{path} line {n} lacks {', '.join(missing)}; is it the N4 JSONL?")
    return rows


def is_n4(rows: list[Mapping[str, Any]]) -> bool:
    return bool(rows) and all(k in rows[0] for k in ("split", "question", "unique_id"))


def parse_n4(rows: Iterable[Mapping[str, Any]], sha256: str, source: str) -> Benchmark:
    """Items from the N4 "≠" questions: stems, and the related identities used as options."""
    stems: dict[str, list[Stem]] = {}
    used: dict[str, dict[str, str]] = {}
    meta: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for row in rows:
        if row["split"] != "diff":
            continue
        parts = split_options(row["question"])
        if parts is None:
            continue
        stem, oa, ob, oc = parts
        name = row["item"]
        related = {norm_identity(r): r for r in row["related"]}
        hits = [o for o in (oa, ob) if norm_identity(o) in related]
        if len(hits) != 1:  # neither or both options related: not a usable stem
            continue
        meta.setdefault(name, (tuple(row["related"]), tuple(row["unrelated"])))
        used.setdefault(name, {})[norm_identity(hits[0])] = related[norm_identity(hits[0])]
        stems.setdefault(name, []).append(Stem(int(row["qtype"]), stem, locate(stem, name), oc))
    items = tuple(Item(name, tuple(used[name].values()), meta[name][1], tuple(stems[name])) for name in sorted(stems))
    return Benchmark(items, sha256, source, format="n4")


def builtin_bytes() -> bytes:
    """The shipped benchmark files, concatenated in a fixed order."""
    root = resources.files("surgery") / "data"
    return b"".join((root / name).read_bytes().rstrip(b"\n") + b"\n" for name in BUILTIN_FILES)


def load_benchmark(spec: str | Path = "builtin") -> Benchmark:
    """``"builtin"`` (shipped items), a file in our JSONL format, or an N4 JSONL file."""
    if str(spec) == "builtin":
        data, source = builtin_bytes(), "builtin"
    else:
        path = Path(spec).expanduser()  # ~ as a shell would: a Python caller's string is not expanded
        if not path.is_file():
            raise BenchmarkError(f"benchmark {path} {not_a_file(path)}; give 'builtin' or a JSONL file")
        data, source = path.read_bytes(), str(path)
    sha = hashlib.sha256(data).hexdigest()
    rows = _read_jsonl(data, source)
    if not rows:  # else the first check to fail would be about identities, not about the file
        raise BenchmarkError(
            f"benchmark {spec} holds no records; give 'builtin' or a JSONL file of templates and items"
        )
    if is_n4(rows):
        return parse_n4(rows, sha, source)
    return parse_own(rows, sha, source)


def option_spans(question: str) -> dict[str, tuple[int, int]]:
    """Character spans of the (a) and (b) option texts of an N4-format question."""
    m = _OPTIONS.search(question)
    if not m:
        raise BenchmarkError("a question must end in '\\n(a) X (b) Y (c) Z' (N4 format)")
    return {"a": m.span("a"), "b": m.span("b")}


def question_spans(question: str, focus: str | None, related_option: int | None) -> dict[str, tuple[int, int]]:
    """Spans an edge edit needs: options a/b, the item (``focus``, first found in the stem), and
    the related identity's option ('tested') and the other option ('control')."""
    spans = option_spans(question)
    stem_end = spans["a"][0]
    if focus:
        where = locate(question[:stem_end], focus)
        if where:
            spans["item"] = where
    if related_option in (0, 1):
        spans["tested"] = spans["ab"[related_option]]
        spans["control"] = spans["ab"[1 - related_option]]
    return spans


def _neutral_focus(stem: str, diff_stems: Iterable[Stem]) -> str | None:
    """The neutral item of an "=" stem: what stands where a "≠" stem of its item names the item
    (every occurrence: some stems name it twice)."""
    for d in diff_stems:
        if d.item_span is None:
            continue
        name = d.text[d.item_span[0] : d.item_span[1]]
        parts = d.text.split(name)
        pattern = (
            re.escape(parts[0])
            + "(?P<f>.+?)"
            + re.escape(parts[1])
            + "".join("(?P=f)" + re.escape(p) for p in parts[2:])
        )
        m = re.fullmatch(pattern, stem, re.DOTALL)
        if m:
            return m["f"]
    return None


def annotate_n4(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """N4 records plus ``focus`` (the item the stem asks about; the neutral item on "=" questions)
    and ``related_option`` (0/1: which option is the related identity), for edge edits."""
    rows = [dict(r) for r in rows]
    by_item = {it.name: it for it in parse_n4(rows, "", "").items}
    for row in rows:
        parts = split_options(row["question"])
        row["focus"], row["related_option"] = None, None
        if parts is None:
            continue
        stem, oa, ob = parts[:3]
        if row["split"] == "diff":
            related = {norm_identity(r) for r in row["related"]}
            hits = [i for i, o in enumerate((oa, ob)) if norm_identity(o) in related]
            row["related_option"] = hits[0] if len(hits) == 1 else None
            span = locate(stem, row["item"])
            row["focus"] = stem[span[0] : span[1]] if span else None
        else:
            row["related_option"] = int(row["answer"])  # N4 "=": the marginalized-group option
            item = by_item.get(row["item"])
            same_type = [s for s in item.stems if s.qtype == row["qtype"]] if item else []
            row["focus"] = _neutral_focus(stem, same_type)
    return rows


def benchmark_awareness_records(bench: Benchmark, seed: int = 0) -> list[dict[str, Any]]:
    """The "≠"/"=" questions that go with a benchmark: N4's own (annotated), or ours (generated)."""
    if bench.format == "n4":
        return annotate_n4(load_n4(bench.source))
    return awareness_records(bench, seed)


def awareness_records(bench: Benchmark, seed: int = 0) -> list[dict[str, Any]]:
    """N4-format "≠" and "=" questions from our own benchmark: for every item and stem one "≠"
    question (the item) and one "=" question (a neutral item of the same question type), both
    with a related and an unrelated identity in random order."""
    import random

    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for item in bench.items:
        for stem in item.stems:
            for split in ("diff", "equal"):
                if split == "diff":
                    text, focus = stem.text, item.name
                else:
                    if not bench.neutral.get(stem.qtype) or stem.item_span is None:
                        continue
                    focus = rng.choice(bench.neutral[stem.qtype])
                    s, e = stem.item_span
                    text = stem.text[:s] + focus + stem.text[e:]
                related, unrelated = rng.choice(item.related), rng.choice(item.unrelated)
                rel = rng.randrange(2)
                opts = [display(unrelated)] * 2
                opts[rel] = display(related)
                question = f"{text}\n(a) {opts[0]} (b) {opts[1]} (c) {stem.equal}"
                # "≠": types 0/1 ask who should refrain (the unrelated one), 2/3 who fits (related).
                answer = (1 - rel if stem.qtype in (0, 1) else rel) if split == "diff" else rel
                out.append(
                    {
                        "split": split,
                        "question": question,
                        "answer": answer,
                        "qtype": stem.qtype,
                        "item": item.name,
                        "related": list(item.related),
                        "unrelated": list(item.unrelated),
                        "focus": focus,
                        "related_option": rel,
                    }
                )
    return out
