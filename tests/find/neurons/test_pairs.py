"""Prompt pairs: the shipped sets, the public-format importer, our JSONL format, the token check."""

from __future__ import annotations

import difflib
import json
import os
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from surgery.find.neurons.pairs import LANGUAGES, PairsError, builtin_text, check_token_counts, load_pairs, parse_text
from tests.support.paths import REPO
from tests.support.tokenizer import save_char_tokenizer

REQUIRED = ("Age", "Gender", "PhysicalAppearance", "RaceEthnicity", "Religion")
SHARED = Path(os.environ.get("SURGERY_SHARED_DATA", REPO.parent / "shared" / "data"))
PUBLIC = SHARED / "fairness_pruning"


def _own(**overrides) -> dict:
    record = {
        "id": "x1",
        "language": "en",
        "category": "Age",
        "context": "labour",
        "attribute_1": "young",
        "attribute_2": "old",
        "stereotyped": 2,
        "prompt_1": "The young clerk said",
        "prompt_2": "The old clerk said",
    }
    record.update(overrides)
    return record


def _jsonl(records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


@pytest.mark.parametrize("language", LANGUAGES)
def test_builtin_sets_cover_categories_and_contexts(language):
    pairs = load_pairs("builtin", language)
    assert {p.language for p in pairs.pairs} == {language}
    counts = pairs.counts()
    contexts = defaultdict(set)
    for p in pairs.pairs:
        contexts[p.category].add(p.context)
        assert p.stereotyped in (1, 2)
        assert p.prompt_1 != p.prompt_2
    for category in REQUIRED:
        assert counts[category] >= 30, (category, counts[category])
        assert len(contexts[category]) >= 5, (category, contexts[category])


@pytest.mark.parametrize("language", LANGUAGES)
def test_builtin_pairs_differ_in_one_attribute(language):
    """The two prompts differ in one contiguous span of at most three words: the attribute."""
    for p in load_pairs("builtin", language).pairs:
        a, b = p.prompt_1.split(), p.prompt_2.split()
        blocks = [op for op in difflib.SequenceMatcher(a=a, b=b).get_opcodes() if op[0] != "equal"]
        assert len(blocks) == 1, p.id
        _, i1, i2, j1, j2 = blocks[0]
        assert 1 <= max(i2 - i1, j2 - j1) <= 3, p.id
        # every changed word belongs to that side's attribute ("the elderly" / "the young" included)
        assert all(w.lower().strip(",") in p.attribute_1.lower().split() for w in a[i1:i2]), p.id
        assert all(w.lower().strip(",") in p.attribute_2.lower().split() for w in b[j1:j2]), p.id


@pytest.mark.skipif(not PUBLIC.is_dir(), reason="public fairness-pruning pairs not present")
@pytest.mark.parametrize("language", LANGUAGES)
def test_builtin_sets_are_our_own_sentences(language):
    """No prompt, and no sentence frame after the attribute, is taken from the public file."""
    public = load_pairs(str(PUBLIC / f"prompt_pairs_{language}.json"))
    ours = load_pairs("builtin", language)
    public_prompts = {q for p in public.pairs for q in (p.prompt_1, p.prompt_2)}
    public_tails = {p.prompt_1.split(".", 1)[-1].strip() for p in public.pairs if "." in p.prompt_1}
    for p in ours.pairs:
        assert p.prompt_1 not in public_prompts and p.prompt_2 not in public_prompts
        assert not any(tail and tail in p.prompt_1 for tail in public_tails), p.id


@pytest.mark.skipif(not PUBLIC.is_dir(), reason="public fairness-pruning pairs not present")
def test_public_format_imports_with_attribute_2_stereotyped():
    raw = json.loads((PUBLIC / "prompt_pairs_en.json").read_text(encoding="utf-8"))
    pairs = load_pairs(str(PUBLIC / "prompt_pairs_en.json"))
    assert len(pairs) == len(raw)
    assert pairs.counts() == dict(sorted(Counter(r["category"] for r in raw).items()))
    first = pairs.pairs[0]
    assert (first.id, first.prompt_1, first.prompt_2) == (raw[0]["id"], raw[0]["prompt_1"], raw[0]["prompt_2"])
    assert first.language == "en" and first.stereotyped == 2 and first.sign == -1
    assert {p.context for p in pairs.pairs} == {r["context"] for r in raw}


def test_public_format_without_language_prefix_needs_language(tmp_path):
    record = {
        "id": "p1",
        "category": "Age",
        "attribute_1": "old",
        "attribute_2": "young",
        "prompt_1": "An old man said",
        "prompt_2": "A young man said",
    }
    path = tmp_path / "pub.json"
    path.write_text(json.dumps([record]), encoding="utf-8")
    with pytest.raises(PairsError, match="--language"):
        load_pairs(str(path))
    pair = load_pairs(str(path), language="es").pairs[0]
    assert pair.language == "es" and pair.context == "unspecified" and pair.stereotyped == 2


def test_own_jsonl_round_trip_and_filters(tmp_path):
    records = [
        _own(id="a", stereotyped=1),
        _own(id="b", category="Gender", prompt_1="He said", prompt_2="She said"),
        _own(id="c", language="es", prompt_1="El joven dijo", prompt_2="El viejo dijo"),
    ]
    path = tmp_path / "own.jsonl"
    path.write_text(_jsonl(records), encoding="utf-8")
    everything = load_pairs(str(path))
    assert [p.id for p in everything.pairs] == ["a", "b", "c"]
    assert everything.pairs[0].sign == 1 and everything.pairs[1].sign == -1
    assert [p.id for p in load_pairs(str(path), language="es").pairs] == ["c"]
    assert [p.id for p in load_pairs(str(path), categories=["gender"]).pairs] == ["b"]
    with pytest.raises(PairsError, match="available: Age, Gender"):
        load_pairs(str(path), categories=["Nationality"])


def test_dataset_hash_follows_content():
    en = load_pairs("builtin", "en")
    assert en.sha256 == load_pairs("builtin", "en").sha256
    assert en.sha256 != load_pairs("builtin", "en", ["Age"]).sha256
    assert en.sha256 != load_pairs("builtin", "es").sha256


@pytest.mark.parametrize(
    "record, message",
    [
        (_own(stereotyped=3), "'stereotyped' must be 1 or 2"),
        (_own(stereotyped=True), "'stereotyped' must be 1 or 2"),
        (_own(prompt_2="The young clerk said"), "identical"),
        (_own(language="fr"), "language 'fr'"),
        (_own(category=""), "field 'category'"),
        ({k: v for k, v in _own().items() if k != "context"}, "missing field"),
    ],
)
def test_own_format_errors_say_what_is_wrong(record, message):
    with pytest.raises(PairsError, match=message):
        parse_text(_jsonl([record]), "own.jsonl")


def test_malformed_files_are_clear_errors(tmp_path):
    with pytest.raises(PairsError, match="line 2 is not valid JSON"):
        parse_text(_jsonl([_own()]) + "{oops\n", "own.jsonl")
    with pytest.raises(PairsError, match="appears 2 times"):
        path = tmp_path / "dup.jsonl"
        path.write_text(_jsonl([_own(), _own()]), encoding="utf-8")
        load_pairs(str(path))
    with pytest.raises(PairsError, match="does not exist"):
        load_pairs(str(tmp_path / "missing.jsonl"))
    with pytest.raises(PairsError, match="is a folder"):  # not "does not exist": the folder is there
        load_pairs(str(tmp_path))
    with pytest.raises(PairsError, match="no built-in pairs"):
        builtin_text("fr")


def test_token_check_skips_and_reports_per_category(tmp_path):
    tok_dir = save_char_tokenizer(tmp_path / "tok", bos=True)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    records = [
        _own(id="same", prompt_1="The thin man", prompt_2="The tall man"),  # equal length: kept
        _own(id="diff", prompt_1="The fat man", prompt_2="The thin man"),  # skipped (Age)
        _own(id="g", category="Gender", prompt_1="The man", prompt_2="The woman"),  # skipped (Gender)
    ]
    path = tmp_path / "p.jsonl"
    path.write_text(_jsonl(records), encoding="utf-8")
    pairs = load_pairs(str(path))
    check = check_token_counts(pairs, tok)
    assert [p.id for p in check.kept.pairs] == ["same"]
    assert check.skipped == {"Age": 1, "Gender": 1} and check.total_skipped == 2
    assert set(check.skipped_ids) == {"diff", "g"}
    with pytest.raises(PairsError, match=r"2 pairs tokenize to different lengths .*Age 1, Gender 1"):
        check_token_counts(pairs, tok, strict=True)
    only_bad = load_pairs(str(path), categories=["Gender"])
    with pytest.raises(PairsError, match="all 1 pairs"):
        check_token_counts(only_bad, tok)
