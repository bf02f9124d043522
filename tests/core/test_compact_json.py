"""compact_json.dumps writes what json.dumps(indent=1) writes, with lists of plain numbers on one line."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from surgery.core import compact_json
from surgery.core.finite_json import finite

# The layout's definition: json's indented text with whitespace removed inside every bracket pair
# that holds only numbers and nulls (how findings files were always written).
_NUMBER_LIST = re.compile(r"\[(?:[-+0-9.eE,\s]|null)*\]")


def reference(obj) -> str:
    text = json.dumps(finite(obj), indent=1, ensure_ascii=False)  # a missing number is null, never NaN
    return _NUMBER_LIST.sub(lambda m: re.sub(r"\s+", "", m.group(0)), text)


def test_a_findings_shaped_file_is_laid_out_as_before():
    rng = np.random.default_rng(0)
    layer = [[float(f"{v:.6g}") for v in row] for row in rng.standard_normal((3, 50)).tolist()]
    layer[1][7] = None  # an unscored neuron
    obj = {
        "version": 1,
        "model": {"path": "models/ü", "fingerprint": "ab12"},
        "scores": {"layers": 3, "width": 50, "ppm": layer, "categories": {"Gender": {"pairs": 4, "bias": layer}}},
        "dataset": {"skipped": {}, "skipped_ids": [], "ids": ["a", "b"]},
        "summary": {
            "neurons": [{"layer": 0, "neuron": 3, "score": 1e-07}, {"layer": 2, "neuron": 1, "score": -2.5e16}]
        },
    }
    assert compact_json.dumps(obj) == reference(obj)
    text = compact_json.dumps(obj)
    assert '"ppm": [\n   [' in text  # the matrix indented, each row on one line:
    assert "\n   " + json.dumps(layer[1], separators=(",", ":")) + "," in text


@pytest.mark.parametrize(
    "obj",
    [
        [],
        {},
        [1, 2.5, None, -3, 10**30],
        [True, False, 1],  # booleans are words: indented, as json writes them
        [1.0, math.nan, 2.0],  # NaN is not JSON's number: a missing one, null
        [math.inf, -math.inf],
        [[], [[]], {}, [{}]],
        (1, 2, (3, 4)),
        {1: "int key", 2.5: "float key", False: "bool", None: "none", "s": ["x", "ÿ", "\u2603", "\x00"]},
        {"nested": {"deeper": {"list": [1, [2, 3], {"k": [4.0]}]}}},
        "just a string",
        42,
        None,
    ],
)
def test_every_value_json_writes_is_written_the_same(obj):
    assert compact_json.dumps(obj) == reference(obj)


def test_a_missing_number_is_null_and_the_text_is_strict_json():
    text = compact_json.dumps({"ci95": [math.nan, math.inf], "p": math.nan, "rows": [[1.5, -math.inf]]})
    assert '"ci95": [null,null]' in text and '"p": null' in text and "[1.5,null]" in text
    assert json.loads(text, parse_constant=_refuse) == {"ci95": [None, None], "p": None, "rows": [[1.5, None]]}


def _refuse(name: str):
    raise ValueError(f"{name} is not JSON")


def test_other_indents_follow_json():
    obj = {"a": [[1, 2], ["x", None]], "b": {"c": []}}
    assert compact_json.dumps(obj, indent=3) == _NUMBER_LIST.sub(
        lambda m: re.sub(r"\s+", "", m.group(0)), json.dumps(obj, indent=3, ensure_ascii=False)
    )


def test_what_json_refuses_is_refused():
    with pytest.raises(TypeError):
        compact_json.dumps({(1, 2): "tuple key"})
    with pytest.raises(TypeError):
        compact_json.dumps({"a": object()})
