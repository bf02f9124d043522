"""JsonRecord, the base of every typed file: keys read into fields and parts, other keys kept in
order, optional keys left out, the order of a file read kept, one-line errors naming the key."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surgery.core.errors import RecipeError, SurgeryError
from surgery.core.json_record import INTEGER, TEXT, JsonRecord, Malformed, entry, listof, mapof, part


@dataclass(kw_only=True)
class Row(JsonRecord):
    name: str = entry(codec=TEXT)
    size: int | None = entry(codec=INTEGER, default=None)


@dataclass(kw_only=True)
class Doc(JsonRecord):
    version: int = 1
    title: str
    rows: list[Row] = entry(codec=listof(part(Row)))
    by_group: dict[str, list[Row]] | None = entry("groups", codec=mapof(listof(part(Row))), default=None)
    note: str | None = entry(default=None, keep_none=True)
    total: int | None = None

    EXTRA_AFTER = "rows"
    LABEL = "doc.json"
    ERROR = RecipeError
    FIX = "write it again"


def _same(a: dict, b: dict) -> bool:
    return json.dumps(a) == json.dumps(b)


def test_a_new_record_is_laid_out_in_its_fields_order_with_extra_entries_in_their_place():
    doc = Doc(title="t", rows=[Row(name="a", size=2), Row(name="b")], extra={"z": 1, "a": [2]})
    assert _same(
        doc.to_dict(),
        {"version": 1, "title": "t", "rows": [{"name": "a", "size": 2}, {"name": "b"}], "z": 1, "a": [2], "note": None},
    )  # optional keys left out, but a kept None


def test_a_record_read_keeps_its_keys_order_and_nulls_and_adds_new_keys_after_them():
    raw = {
        "note": "n",
        "extra1": {"x": None},
        "total": None,
        "title": "t",
        "rows": [{"size": 3, "name": "a"}],
        "version": 1,
        "groups": {"g": [{"name": "b", "future": True}]},
    }
    doc = Doc.from_dict(raw)
    assert _same(doc.to_dict(), raw)
    assert doc.by_group["g"][0].extra == {"future": True} and doc.rows[0].size == 3 and doc.total is None
    doc.total = 7
    doc.rows.append(Row(name="c"))
    assert list(doc.to_dict()) == list(raw) and doc.to_dict()["rows"][1] == {"name": "c"}
    assert Doc.from_dict({k: v for k, v in raw.items() if k != "total"}).to_dict().get("total", "absent") == "absent"
    assert Doc.from_dict(doc.to_dict()) == doc


@pytest.mark.parametrize(
    "raw, says",
    [
        ([], "doc.json: must be a JSON object, got list; write it again"),
        ({"rows": []}, "doc.json: 'title' is missing; write it again"),
        ({"title": "t", "rows": {}}, "doc.json: 'rows' must be a list, got dict; write it again"),
        ({"title": "t", "rows": [{"name": 3}]}, "doc.json: 'rows[0].name' must be a string, got int; write it again"),
        ({"title": "t", "rows": [{"name": "a", "size": True}]}, "'rows[0].size' must be an integer, got bool"),
        ({"title": "t", "rows": [], "groups": {"g": [1]}}, "'groups.g[0]' must be a JSON object, got int"),
        ({"title": "t", "rows": None}, "'rows' must be a list, got NoneType"),
    ],
)
def test_a_malformed_object_is_one_line_naming_the_key(raw, says):
    with pytest.raises(RecipeError) as caught:
        Doc.from_dict(raw)
    assert says in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(Malformed):  # a part read on its own says where, without the file's fix
        Doc.read(raw)


def test_an_extra_entry_may_not_shadow_a_key_of_the_record():
    with pytest.raises(ValueError, match="clash"):
        Doc(title="t", rows=[], extra={"note": "x"}).to_dict()
    assert issubclass(Malformed, SurgeryError)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)
_rows = st.lists(
    st.fixed_dictionaries(
        {"name": st.text(max_size=3)}, optional={"size": st.integers(0, 9) | st.none(), "more": _json}
    ),
    max_size=3,
)


@st.composite
def _docs(draw) -> dict:
    raw = draw(
        st.fixed_dictionaries(
            {"title": st.text(max_size=5), "rows": _rows},
            optional={
                "version": st.integers(1, 3),
                "groups": st.dictionaries(st.text(max_size=3), _rows, max_size=2),
                "note": st.text(max_size=3) | st.none(),
                "total": st.integers() | st.none(),
            },
        )
    )
    own = set(raw) | {"groups", "note", "total", "version"}
    raw.update({k: v for k, v in draw(st.dictionaries(st.text(max_size=4), _json, max_size=3)).items() if k not in own})
    return {k: raw[k] for k in draw(st.permutations(list(raw)))}


@settings(max_examples=150, deadline=None)
@given(raw=_docs())
def test_any_object_reads_and_writes_back_unchanged(raw):
    doc = Doc.from_dict(raw)
    assert _same(doc.to_dict(), raw)
    assert Doc.from_dict(doc.to_dict()) == doc
