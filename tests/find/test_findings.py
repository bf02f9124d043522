"""Findings files as typed records: files written by surgery 0.1 (the cache holds them) read, are
applied to their model, and write back byte for byte; a newer version is refused in one line."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surgery.core.checkpoint import Checkpoint
from surgery.core.errors import FindingsError
from surgery.find.findings import Findings, load_findings, save_findings
from surgery.find.heads.find import HeadFindings
from surgery.find.heads.record import HeadsFindings
from surgery.find.neurons.find import NeuronFindings, write_findings
from surgery.find.neurons.params import SelectParams
from surgery.find.neurons.record import NeuronsFindings
from tests.support.paths import FIXTURES

WRITTEN = FIXTURES / "written_by_0.1"  # find-heads / find-neurons on the planted fixtures (see its make.py)


def test_heads_findings_of_0_1_apply_to_their_model_and_write_back_unchanged(tmp_path):
    path = WRITTEN / "heads_findings.json"
    raw = json.loads(path.read_text())
    found = HeadFindings.read(path, Checkpoint(FIXTURES / "binding_model"))
    found.check()
    f = found.data
    assert found.select() == [tuple(h) for h in raw["selected_heads"]] == f.selected()
    assert found.select(5) == f.ranking()[:5]
    assert [(h.layer, h.head) for h in f.confirmation.heads] == [
        (h["layer"], h["head"]) for h in raw["confirmation"]["heads"]
    ]
    assert f.scores.S.delta == raw["scores"]["S"]["delta"] and f.discovery.auc == raw["discovery"]["auc"]
    assert f.knockout.tested.ci95 == raw["knockout"]["tested"]["ci95"] and f.knockout.random.n == 2
    assert [p.alpha for p in f.dose_response] == [r["alpha"] for r in raw["dose_response"]]
    assert f.awareness[0].edge.n_diff == raw["awareness"][0]["edge"]["n_diff"]
    assert f.compute.dtype == "float32" and f.model.path == "tests/fixtures/binding_model"
    assert f.weak_heads() == max(0, len(raw["selected_heads"]) - raw["confirmation"]["n_significant"])
    record = found.record()
    assert record["selected_heads"] == raw["selected_heads"] and record["p_s"] == raw["scores"]["S"]["p"]
    save_findings(f, tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == path.read_bytes()


def test_neuron_findings_of_0_1_apply_to_their_model_and_write_back_unchanged(tmp_path):
    path = WRITTEN / "neurons_findings.json"
    raw = json.loads(path.read_text())
    found = NeuronFindings.read(path, Checkpoint(FIXTURES / "bias_model"))
    found.check()
    f = found.data
    assert f.dataset.pairs_used == raw["dataset"]["pairs_used"] and "skipped_ids" not in f.dataset.brief()
    assert f.summary.n == raw["summary"]["n"] and f.summary.layers is None
    assert [(r.layer, r.neuron) for r in f.summary.neurons] == [
        (r["layer"], r["neuron"]) for r in raw["summary"]["neurons"]
    ]
    chosen = found.select(raw["summary"]["n"], SelectParams())
    assert list(chosen.neurons) == [(r["layer"], r["neuron"]) for r in raw["summary"]["neurons"]]
    assert found.record()["dataset"] == {k: v for k, v in raw["dataset"].items() if k != "skipped_ids"}
    write_findings(f, tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == path.read_bytes()


def test_findings_of_another_model_are_refused_by_their_identity():
    with pytest.raises(FindingsError, match="another model .*tests/fixtures/binding_model.* transfer=True"):
        HeadFindings.read(WRITTEN / "heads_findings.json", Checkpoint(FIXTURES / "binding_dose"))
    found = HeadFindings.read(WRITTEN / "heads_findings.json", Checkpoint(FIXTURES / "binding_dose"), transfer=True)
    assert "same architecture" in found.transfer_note


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda raw: raw.update(version=2), "has findings version 2; this surgery reads version 1: recompute it"),
        (lambda raw: raw.update(kind="neurons"), "holds 'neurons' findings, but heads findings are needed"),
        (
            lambda raw: raw["discovery"].update(heads={}),
            "'discovery.heads' must be a list, got dict; recompute it with surgery find-heads",
        ),
        (
            lambda raw: raw["knockout"].pop("tested"),
            "'knockout.tested' is missing; recompute it with surgery find-heads",
        ),
        (lambda raw: raw["model"].update(fingerprint=7), "'model.fingerprint' must be a string, got int"),
    ],
)
def test_a_newer_or_malformed_findings_file_is_refused_in_one_line(tmp_path, change, says):
    raw = json.loads((WRITTEN / "heads_findings.json").read_text())
    change(raw)
    (tmp_path / "f.json").write_text(json.dumps(raw))
    with pytest.raises(FindingsError) as caught:
        load_findings(tmp_path / "f.json", "heads", HeadsFindings)
    assert says in str(caught.value) and "\n" not in str(caught.value)
    assert HeadFindings.cached(tmp_path / "f.json", Checkpoint(FIXTURES / "binding_model")) is None  # recomputed


def _same(a: dict, b: dict) -> bool:
    return json.dumps(a) == json.dumps(b)


def _pruned(raw: dict, drop: set[str]) -> dict:
    return {k: v for k, v in raw.items() if k not in drop}


_optional = st.sets(
    st.sampled_from(
        [
            "tool_version",
            "dataset_sha256",
            "parameters",
            "prompt_format",
            "compute",
            "pairs",
            "scores",
            "confirmation",
            "knockout",
            "dose_response",
            "cost",
            "awareness",
            "dataset",
            "summary",
            "experts",
        ]
    )
)
_kept = st.dictionaries(st.text("abcdef_", min_size=1, max_size=6), st.integers() | st.text(max_size=3), max_size=2)


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(["heads_findings.json", "neurons_findings.json"]),
    drop=_optional,
    new=_kept,
    order=st.randoms(use_true_random=False),
)
def test_any_findings_file_round_trips(name, drop, new, order):
    """The 0.1 files with parts left out (older or partial runs), entries of a newer surgery added,
    keys in any order: read, they write back the same; the typed record survives its own JSON."""
    raw = _pruned(json.loads((WRITTEN / name).read_text()), drop)
    raw.update({k: v for k, v in new.items() if k not in raw and k not in drop})
    keys = list(raw)
    order.shuffle(keys)
    raw = {k: raw[k] for k in keys}
    record_type = HeadsFindings if raw["kind"] == "heads" else NeuronsFindings
    for cls in (record_type, Findings):
        record = cls.from_dict(raw)
        assert _same(record.to_dict(), raw)
        assert cls.from_dict(record.to_dict()) == record
    if "experts" not in drop:  # the dense fixture has none: a mixture's report reads as well
        experts = {
            "experts": 4,
            "expert_width": 8,
            "shared_width": 0,
            "unscored_neurons": 3,
            "routing": {"Gender": [{"layer": 0, "expert": 2, "signed": 0.1, "abs": 0.2}]},
        }
        record = NeuronsFindings.from_dict(
            {**json.loads((WRITTEN / "neurons_findings.json").read_text()), "experts": experts}
        )
        assert record.experts.routing["Gender"][0].mean_abs == 0.2 and record.to_dict()["experts"] == experts


def test_a_folder_given_as_findings_is_named_a_folder_not_missing(tmp_path):
    with pytest.raises(FindingsError) as caught:
        load_findings(tmp_path, "heads", HeadsFindings)
    said = str(caught.value)
    assert f"{tmp_path} is a folder" in said and "does not exist" not in said
    assert "surgery find-heads" in said and "\n" not in said
