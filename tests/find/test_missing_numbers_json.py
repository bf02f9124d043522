"""A missing number (a knockout without CI) is written as null, not NaN: findings files and a baked
folder's surgery.json parse with a strict JSON parser (jq, JavaScript), read back the same, and the
files written before (NaN) still read, verify and show "—"."""

from __future__ import annotations

import hashlib
import json
import math

import surgery
from surgery.bake.provenance import integrity_problems, load_provenance
from surgery.find.findings import load_findings
from surgery.find.heads import causal
from surgery.find.heads.find import HeadFindings
from tests.support.binding import FAST, char_model, write_small_benchmark
from tests.support.cli import main_output, run_main
from tests.support.paths import FIXTURES
from tests.support.strict_json import strict

DIRECTIONS = FIXTURES / "direction_model"


def test_a_missing_ci_is_null_and_files_with_nan_still_read(tiny, tmp_path, capsys, monkeypatch):
    """find-heads on a tiny model whose knockouts get no CI (the resamples' sign rule never holds),
    then amplify-heads from those findings (one run for both halves: it takes most of the time)."""
    monkeypatch.setattr(causal, "SIGN_KEPT", 1.01)
    model = char_model(tiny, "llama")
    bench = write_small_benchmark(tmp_path / "small.jsonl")
    found = tmp_path / "f.json"
    code, _, err = main_output(capsys, "find-heads", model, "--benchmark", bench, *FAST, "--out", found)
    assert code == 0, err
    baked = tmp_path / "baked"
    code, _, err = main_output(
        capsys, "amplify-heads", model, "--findings", found, "--alpha", "2", "--top", "1", "--out", baked
    )
    assert code == 0, err
    data = strict(found.read_text())  # raises on NaN
    assert data["knockout"]["tested"]["ci95"] == [None, None]
    findings = load_findings(found, "heads", HeadFindings.record_type)
    assert findings.knockout.tested.ci95 == [None, None]
    assert findings.to_dict() == data  # read back the same, key for key
    record = strict((baked / "surgery.json").read_text())
    assert record["heads_findings"]["knockout_ci95"] == [None, None]
    assert integrity_problems(baked, load_provenance(baked)) == []  # the seal holds
    card = (baked / "README.md").read_text()
    assert "nan" not in card.lower() and "knockout_ci95: —, —" in card

    # the findings as surgery wrote them before: NaN for the missing bounds
    old = json.loads(found.read_text())
    old["knockout"]["tested"]["ci95"] = [math.nan, math.nan]
    found.write_text(json.dumps(old, indent=1) + "\n")
    findings = load_findings(found, "heads", HeadFindings.record_type)
    assert all(math.isnan(v) for v in findings.knockout.tested.ci95)
    # surgery.json as it was sealed before: the seal over the text with NaN
    body = json.loads((baked / "surgery.json").read_text())
    del body["provenance_sha256"]
    body["heads_findings"]["knockout_ci95"] = [math.nan, math.nan]
    seal = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    (baked / "surgery.json").write_text(json.dumps({**body, "provenance_sha256": seal}, indent=1) + "\n")
    assert "NaN" in (baked / "surgery.json").read_text()
    assert integrity_problems(baked, load_provenance(baked)) == []
    code, out, err = main_output(capsys, "verify", model, baked)
    assert code == 0, err + out


def test_an_infinite_separation_is_null_in_the_file_and_read_back_as_infinite(tmp_path, capsys):
    """One prompt a side: no variance along the direction, Cohen's d is infinite (not a JSON number)."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    for path, name in ((a, "a"), (b, "b")):
        path.write_text((DIRECTIONS / f"{name}.txt").read_text().splitlines()[0] + "\n")
    found = surgery.find_direction(DIRECTIONS, a=a, b=b, device="cpu")
    assert all(math.isinf(r.separation) for r in found.data.layers)
    data = strict(found.path.read_text())  # raises on Infinity
    assert [r["separation"] for r in data["layers"]] == [None] * len(found.data.layers)
    again = surgery.find_direction(DIRECTIONS, a=a, b=b, device="cpu")
    assert again.from_cache and again.data == found.data
    shown = run_main(["find-direction", DIRECTIONS, "--a", a, "--b", b, "--device", "cpu"], capsys)
    assert shown.returncode == 0, shown.stderr  # the table prints the cached findings
    assert "inf" in shown.stdout
