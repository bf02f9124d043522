"""surgery.json and surgery_adapter.json as typed records: what a bake writes is byte for byte what
surgery 0.1 wrote, files of every earlier layout read (and write back unchanged), a newer version
or a malformed part is refused in one line."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import surgery.bake.bake as bake_module
import surgery.bake.lora as lora_module
from surgery.bake.bake import bake
from surgery.bake.card import card_hook, card_text
from surgery.bake.check import edited_check
from surgery.bake.lora import export_lora
from surgery.bake.provenance import load_provenance, provenance_text, record_text
from surgery.bake.record import AdapterRecord, BakeRecord, Verification
from surgery.bake.undo import undo
from surgery.bake.verify import verify
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import VerificationError
from surgery.core.evaluation_table import Evaluation
from surgery.model.loading import Source
from surgery.ship.card import refresh_card
from tests.support.cli import error_line, run_main
from tests.support.paths import FIXTURES

WRITTEN = FIXTURES / "written_by_0.1"  # see its make.py: the same inputs as below, baked by surgery 0.1.0
RECIPE = Recipe((HeadScale(0, 1, 2.0), NeuronScale(1, 3, 0.0)), base_model="bias_model")
VERIFICATION = {
    "kind": "edited maps",
    "maps": 4,
    "inputs": 4,
    "max_abs_diff": 0.0,
    "max_diff_over_bound": 0.0,
    "reference": "source weights with the run-time twin",
    "end_to_end": "surgery verify compares the logits",
}
EVALUATION = {
    "rows": [
        {"metric": "perplexity", "label": "Perplexity", "before": 12.5, "after": 12.75, "retained_pct": 98.04},
        {
            "metric": "bbq_bias_ambig",
            "label": "BBQ bias (ambiguous)",
            "before": 0.1,
            "after": 0.05,
            "retained_pct": None,
        },
    ],
    "note": "Measured with `surgery eval`.",
    "settings": {"limit": 5},
}
EXTRA = {
    "heads_findings": {
        "dataset_sha256": "0" * 64,
        "p_s": 0.6,
        "knockout_ci95": [-1.0, 2.0],
        "selected_heads": [[0, 1]],
        "weak_heads": 1,
    },
    "neuron_selection": {"n": 1, "rule": "global", "neurons": [{"layer": 1, "neuron": 3}], "factor": 0.0},
}


class FixedClock(dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


def _written(name: str) -> tuple[str, dict]:
    text = (WRITTEN / name).read_text(encoding="utf-8")
    return text, json.loads(text)


def _same(a: dict, b: dict) -> bool:
    """The same keys, in the same order, with the same values, at every level."""
    return json.dumps(a) == json.dumps(b)


def test_a_bake_writes_surgery_json_byte_for_byte_as_0_1_did(tmp_path, monkeypatch):
    monkeypatch.setattr(bake_module, "_dt", type("dt", (), {"datetime": FixedClock, "timezone": dt.timezone}))
    monkeypatch.setattr(bake_module, "__version__", "0.1.0")
    monkeypatch.setattr(lora_module, "__version__", "0.1.0")
    src = Checkpoint(FIXTURES / "bias_model")

    def card(staged: Path, record: BakeRecord) -> str:
        record.evaluation = Evaluation.from_dict(EVALUATION)
        return "# card\n"

    result = bake(
        src,
        RECIPE,
        tmp_path / "baked",
        source=Source(Path("bias_model")),
        check=lambda staged: Verification.from_dict(VERIFICATION),
        card=card,
        extra=EXTRA,
    )
    assert (tmp_path / "baked" / "surgery.json").read_text() == _written("surgery.json")[0]
    assert result.provenance == load_provenance(tmp_path / "baked")  # what bake returns is what it wrote
    adapter = tmp_path / "adapter"
    export_lora(src, RECIPE, adapter, source=Source(Path("bias_model")))
    # As 0.1 wrote it, and since issue 33 the sha256 of the folder's other files (what --force may replace).
    written = json.loads((adapter / "surgery_adapter.json").read_text())
    files = written.pop("files")
    assert json.dumps(written, indent=1) + "\n" == _written("surgery_adapter.json")[0]
    assert files == {p.name: file_sha256(p) for p in sorted(adapter.iterdir()) if p.name != "surgery_adapter.json"}


def test_files_written_by_0_1_read_and_write_back_unchanged():
    text, raw = _written("surgery.json")
    record = BakeRecord.from_dict(raw)
    assert record_text(record) == text
    assert record.source == Source(Path("bias_model"), fingerprint=raw["source"]["fingerprint"])
    assert record.recipe == RECIPE and record.verification.maps == 4 and not record.verification.compared_logits
    assert [e.tensor for e in record.edited_tensors][:2] == [
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
    ]
    assert record.edited_tensors[0].cols_key == "slice0.cols" and record.edited_tensors[0].rows_key is None
    assert record.extra == EXTRA and list(record.extra) == list(EXTRA)
    assert record.evaluation.rows[1].retained_pct is None and record.undo.added_files == ["README.md"]
    assert record.weight_hashes() == {"model.safetensors": raw["files"]["model.safetensors"]}
    text, raw = _written("surgery_adapter.json")
    adapter = AdapterRecord.from_dict(raw)
    assert json.dumps(adapter.to_dict(), indent=1) + "\n" == text
    assert adapter.modules == {"model.layers.0.self_attn.o_proj": 8, "model.layers.1.mlp.down_proj": 1}
    assert adapter.extra == {"heads": 1, "neurons": 1} and adapter.recipe == RECIPE


def _first_release(raw: dict) -> dict:
    """``raw`` as the first release wrote it: no fingerprint of the source (9a14c29), the check
    compared whole-model logits, no left-out files (abb5b8c), no ``hashing`` (103c58b), no card
    table, no command entries and no seal (a8ff436); files in the order they were hashed."""
    old = {k: v for k, v in raw.items() if k not in ("hashing", "evaluation", "provenance_sha256", *EXTRA)}
    old["source"] = {k: v for k, v in raw["source"].items() if k != "fingerprint"}
    old["verification"] = {"max_abs_logit_diff": 3.1e-7, "tolerance": 1e-4, "prompts": 4, "reference": "run-time hooks"}
    old["undo"] = {k: v for k, v in raw["undo"].items() if k != "left_out_files"}
    old["files"] = dict(reversed(raw["files"].items()))
    return old


def _layouts() -> list[dict]:
    raw = _written("surgery.json")[1]
    before_cache = {**raw, "hashing": {k: v for k, v in raw["hashing"].items() if k != "source_files_from_hash_cache"}}
    no_check = {k: v for k, v in raw.items() if k != "verification"}  # --no-verify
    return [raw, before_cache, no_check, _first_release(raw)]


@pytest.mark.parametrize("raw", _layouts(), ids=["0.1", "before-hash-cache", "no-verify", "first-release"])
def test_every_earlier_layout_reads_and_writes_back_unchanged(raw):
    record = BakeRecord.from_dict(raw)
    assert _same(record.to_dict(), raw)
    assert BakeRecord.from_dict(record.to_dict()) == record
    card_text(record)  # the card renders every layout


def test_the_first_release_layout_reads_as_such():
    record = BakeRecord.from_dict(_first_release(_written("surgery.json")[1]))
    assert record.source.fingerprint is None and record.hashing is None and record.seal is None
    assert record.undo.left_out_files is None and record.extra == {}
    assert record.verification.compared_logits and record.verification.kind is None
    assert "max |Δlogit| = 3.10e-07 (tolerance 0.0001)" in card_text(record)


def test_a_bake_in_the_first_release_layout_verifies_and_undoes(tiny, tmp_path):
    """A folder whose surgery.json has the first release's layout (sealed, as the card refresh of
    today writes it) passes verify and undo restores its source."""
    src = tiny("llama")
    out = tmp_path / "baked"
    bake(Checkpoint(src), RECIPE, out, check=edited_check(Checkpoint(src), RECIPE))
    old = _first_release(json.loads((out / "surgery.json").read_text()))
    (out / "surgery.json").write_text(provenance_text(old))
    assert load_provenance(out).source.fingerprint is None
    assert verify(Checkpoint(src), out, run_model=False).ok
    restored = undo(out, tmp_path / "restored")
    assert restored == {f.name: file_sha256(f) for f in src.iterdir()}


def _rewrite(folder: Path, change) -> None:
    raw = json.loads((folder / "surgery.json").read_text())
    change(raw)
    (folder / "surgery.json").write_text(provenance_text(raw))


@pytest.mark.parametrize(
    "change, says",
    [
        (
            lambda raw: raw.update(version=2),
            "has surgery.json version 2; this surgery reads version 1: upgrade surgery",
        ),
        (lambda raw: raw.update(files=[]), "'files' must be a JSON object, got list; it was edited after the bake"),
        (lambda raw: raw.pop("undo"), "'undo' is missing; it was edited after the bake: bake again"),
        (lambda raw: raw["undo"].update(replaced_files="README.md"), "'undo.replaced_files' must be a list, got str"),
        (lambda raw: raw["edited_tensors"][0].pop("tensor"), "'edited_tensors[0].tensor' is missing"),
        (lambda raw: raw["source"].update(path=None), "'source.path' must be the source folder"),
    ],
)
def test_a_newer_or_malformed_surgery_json_is_refused_in_one_line(tiny, tmp_path, capsys, change, says):
    src = tiny("llama")
    out = tmp_path / "baked"
    bake(Checkpoint(src), RECIPE, out)
    _rewrite(out, change)
    with pytest.raises(VerificationError) as caught:
        load_provenance(out)
    assert says in str(caught.value) and "\n" not in str(caught.value)
    line = error_line(run_main(["verify", str(src), str(out), "--structural-only"], capsys))
    assert line.startswith("Error: ") and says in line


def test_a_refreshed_card_lists_only_the_commands_entries_under_why(tiny, tmp_path):
    """surgery.json's own parts are not findings: the refresh showed ``hashing`` under "Why"."""
    out = tmp_path / "baked"
    bake(Checkpoint(tiny("llama")), RECIPE, out, card=card_hook(), extra=EXTRA)
    first = (out / "README.md").read_text()
    refresh_card(out)
    why = (out / "README.md").read_text().split("## Why")[1].split("## Verification")[0]
    assert why == first.split("## Why")[1].split("## Verification")[0]
    assert "hashing" not in why and "**heads_findings**" in why and "**neuron_selection**" in why


# --- round trips on generated records ----------------------------------------------------------

# surgery.json's own keys; any other is a command's entry
OWN_KEYS = {
    "format",
    "version",
    "tool_version",
    "created",
    "source",
    "model_type",
    "recipe",
    "edited_tensors",
    "verification",
    "evaluation",
    "undo",
    "files",
    "source_files",
    "hashing",
    "pushed",
    "provenance_sha256",
}
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-9, 9) | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
_names = st.lists(st.text("abcxyz._", min_size=1, max_size=6), max_size=3, unique=True)


@st.composite
def _records(draw) -> dict:
    """surgery.json of the 0.1 fixture with optional parts left out, command entries added and every
    object's keys in a drawn order (a file another tool rewrote)."""
    raw = json.loads(json.dumps(_written("surgery.json")[1]))
    for key in draw(
        st.sets(
            st.sampled_from(
                ["verification", "evaluation", "hashing", "provenance_sha256", "heads_findings", "neuron_selection"]
            )
        )
    ):
        raw.pop(key)
    raw["undo"]["left_out_files"] = draw(_names)
    raw["files"] = {n: "0" * 64 for n in draw(_names)}
    own = set(raw)
    raw.update(
        {
            k: v
            for k, v in draw(st.dictionaries(st.text(min_size=1, max_size=5), _json, max_size=3)).items()
            if k not in own
        }
    )
    order = draw(st.permutations(list(raw)))
    return {k: raw[k] for k in order}


@settings(max_examples=60, deadline=None)
@given(raw=_records())
def test_any_surgery_json_round_trips(raw):
    record = BakeRecord.from_dict(raw)
    assert _same(record.to_dict(), raw)
    assert BakeRecord.from_dict(record.to_dict()) == record
    assert set(record.extra) == set(raw) - OWN_KEYS
