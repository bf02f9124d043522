"""The binding benchmark: shipped items, our JSONL format, the N4 importer, factorial pairs, spans."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from surgery.core.errors import SurgeryError
from surgery.core.mcq import BASE_ANSWER_START, INSTRUCTION, cue_token_id, encode_question
from surgery.find.heads.benchmark import (
    QTYPES,
    BenchmarkError,
    annotate_n4,
    awareness_records,
    load_benchmark,
    load_n4,
    norm_identity,
    question_spans,
)
from surgery.find.heads.pairs import KNOWLEDGE_EQUAL, build_pairs
from tests.support.binding import CHAT, n4_path, write_small_benchmark
from tests.support.tokenizer import char_tokenizer


@pytest.fixture(scope="module")
def builtin():
    return load_benchmark("builtin")


def test_builtin_benchmark_content(builtin):
    assert len(builtin.items) >= 60
    assert set(builtin.templates) == set(QTYPES) and set(builtin.neutral) == set(QTYPES)
    assert {s.qtype for it in builtin.items for s in it.stems} == set(QTYPES)
    for it in builtin.items:
        assert len(it.related) >= 2 and len(it.unrelated) >= 2 and it.culture
        for stem in it.stems:  # every stem names its item exactly where the span says
            assert stem.text[stem.item_span[0] : stem.item_span[1]] == it.name
    # an identity related to items of two cultures would make "no shared identity" meaningless
    owners: dict[str, set] = {}
    for it in builtin.items:
        for r in it.related:
            owners.setdefault(norm_identity(r), set()).add(it.culture)
    assert all(len(c) == 1 for c in owners.values())
    assert len(builtin.sha256) == 64


def _check_pairs(bench, pairs):
    by_name = {it.name: it for it in bench.items}
    correct, wrong = Counter(), Counter()
    for p in pairs:
        item = by_name[p.item]
        assert norm_identity(p.related) in item.related_keys()
        assert norm_identity(p.wrong) not in item.related_keys()
        assert norm_identity(p.distractor) not in item.related_keys() | {norm_identity(p.wrong)}
        w_owner = by_name[p.wrong_item]
        assert norm_identity(p.wrong) in w_owner.related_keys()
        assert not item.conflicts(w_owner)  # W comes from an item sharing no identity
        for q, identity in ((p.match, p.related), (p.mismatch, p.wrong)):
            span = {k: q.text[s:e] for k, (s, e) in q.spans.items()}
            assert span["tested"].endswith(identity.split(" ", 1)[1]) and span["tested"].startswith("the ")
            assert span["control"].endswith(p.distractor.split(" ", 1)[1])
            assert span["ab"[p.slot]] == span["tested"] and span["item"].lower().endswith(
                p.item.lower().split(" ", 1)[-1]
            )
        # match and mismatch differ only in the identity slot
        ms, me = p.match.spans["tested"]
        ws, we = p.mismatch.spans["tested"]
        assert p.match.text[:ms] == p.mismatch.text[:ws] and p.match.text[me:] == p.mismatch.text[we:]
        assert p.k_match.text.endswith(KNOWLEDGE_EQUAL) and p.item in p.k_match.text
        correct[norm_identity(p.related)] += 1
        wrong[norm_identity(p.wrong)] += 1
    assert correct == wrong  # balanced: each identity as often "correct" as "wrong"
    assert {p.slot for p in pairs} == {0, 1}


def test_pairs_builtin_balanced_and_seeded(builtin):
    pairs = build_pairs(builtin, seed=3, per_identity=4)
    _check_pairs(builtin, pairs)
    assert max(Counter(norm_identity(p.related) for p in pairs).values()) <= 4
    assert len({p.item for p in pairs}) == len(builtin.items)
    again = build_pairs(builtin, seed=3, per_identity=4)
    assert [p.to_dict() for p in again] == [p.to_dict() for p in pairs]
    other = build_pairs(builtin, seed=4, per_identity=4)
    assert [p.to_dict() for p in other] != [p.to_dict() for p in pairs]
    subset = build_pairs(builtin, seed=3, per_identity=4, max_pairs=40)
    assert len(subset) == 40
    _check_pairs(builtin, subset)
    distractors = Counter(p.distractor for p in pairs)  # least-used choice spreads the distractors
    assert max(distractors.values()) - min(distractors.values()) <= 4


def test_own_format_file_and_errors(tmp_path):
    bench = load_benchmark(write_small_benchmark(tmp_path / "b.jsonl"))
    assert len(bench.items) == 6 and len(bench.items[0].stems) == 2
    _check_pairs(bench, build_pairs(bench, seed=0))
    bad = tmp_path / "bad.jsonl"
    for line, message in [
        ("{nope", "not JSON"),
        ('{"kind": "thing"}', "kind must be"),
        ('{"kind": "template", "qtype": 9, "text": "{item}", "equal": "x"}', "qtype"),
        ('{"kind": "template", "qtype": 0, "text": "no slot", "equal": "x"}', "placeholder"),
        ('{"kind": "item", "item": "x", "qtypes": [1], "related": ["a"], "unrelated": ["b"]}', "no template"),
    ]:
        bad.write_text(line + "\n")
        with pytest.raises(BenchmarkError, match=message):
            load_benchmark(bad)
    with pytest.raises(SurgeryError, match="does not exist"):
        load_benchmark(tmp_path / "missing.jsonl")
    with pytest.raises(BenchmarkError, match=f"benchmark {tmp_path} is a folder; give 'builtin' or a JSONL file"):
        load_benchmark(tmp_path)
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(BenchmarkError, match="empty.jsonl holds no records"):
        load_benchmark(tmp_path / "empty.jsonl")
    one_culture = [r for r in map(json.loads, (tmp_path / "b.jsonl").read_text().splitlines())]
    for r in one_culture:
        if r["kind"] == "item":
            r["culture"] = "same"
    bad.write_text("".join(json.dumps(r) + "\n" for r in one_culture))
    with pytest.raises(BenchmarkError, match="no two items"):
        build_pairs(load_benchmark(bad))


def test_awareness_records_answers(builtin):
    recs = awareness_records(builtin, seed=1)
    n_stems = sum(len(it.stems) for it in builtin.items)
    assert Counter(r["split"] for r in recs) == {"diff": n_stems, "equal": n_stems}
    for r in recs:
        spans = question_spans(r["question"], r["focus"], r["related_option"])
        tested = r["question"][slice(*spans["tested"])]
        assert any(tested.endswith(x.split(" ", 1)[1]) for x in r["related"])
        assert r["question"][slice(*spans["item"])] == r["focus"]
        if r["split"] == "equal":
            assert r["focus"] != r["item"] and r["answer"] == r["related_option"]
        elif r["qtype"] in (0, 1):  # who should refrain: the unrelated identity
            assert r["answer"] == 1 - r["related_option"]
        else:  # who should be chosen: the related identity
            assert r["answer"] == r["related_option"]


@pytest.mark.parametrize("instruct", [False, True])
def test_prompt_encoding_spans(builtin, instruct):
    tok = char_tokenizer(CHAT)
    pair = build_pairs(builtin, seed=0, max_pairs=2)[0]
    q = pair.match
    enc = encode_question(tok, q.text, q.spans, instruct=instruct)
    for name, (s, e) in q.spans.items():
        assert tok.decode([enc.ids[i] for i in enc.spans[name]]) == q.text[s:e]
    text = tok.decode(enc.ids)
    if instruct:
        assert text.startswith("<s>user: ") and text.endswith("\nAnswer:\nassistant:")
    else:  # docs/methods/binding-heads.md: text + "\n" + answer start, then a separate "(" token
        assert enc.ids[-1] == cue_token_id(tok)
        assert text.removeprefix("<s>") == q.text + "\n\n" + INSTRUCTION + BASE_ANSWER_START + "("


def _n4():
    path = n4_path()
    if not path.is_file():
        pytest.skip(f"N4 data not at {path} (set SURGERY_SHARED_DATA)")
    return path


def test_n4_importer_and_pairs():
    path = _n4()
    rows = load_n4(path)
    assert len(rows) == 2000 and {r["split"] for r in rows} == {"diff", "equal"}
    bench = load_benchmark(path)
    assert bench.format == "n4" and len(bench.items) == 66
    assert all(s.item_span is not None for it in bench.items for s in it.stems)
    pairs = build_pairs(bench, seed=0)
    _check_pairs(bench, pairs)
    assert 600 <= len(pairs) <= 1200  # the paper used 847 pairs over 66 items
    recs = annotate_n4(rows)
    assert all(r["focus"] and r["related_option"] in (0, 1) for r in recs)
    eq = next(r for r in recs if r["split"] == "equal")
    assert eq["focus"] in eq["question"] and eq["focus"] != eq["item"]


def test_load_n4_rejects_other_files(tmp_path):
    path = write_small_benchmark(tmp_path / "b.jsonl")
    with pytest.raises(BenchmarkError, match="N4"):
        load_n4(path)
