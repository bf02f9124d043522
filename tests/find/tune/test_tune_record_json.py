"""A tune record's missing numbers (a CI the bootstrap gave no interval, an effect over no prompts) are
``null`` in tune.json, which a strict JSON parser (jq, JavaScript) reads; the record reads them back as
NaN, as it reads a tune.json written before (``NaN`` in the file), and its readers compute as before."""

from __future__ import annotations

import json
import math

from surgery.core.checkpoint import Checkpoint
from surgery.core.finite_json import finite
from tests.support.strict_json import strict


def _record(tiny):
    from surgery.find.findings import ModelIdentity
    from surgery.find.tune.record import Chosen, HeldOutConfirmation, SplitSizes, Trial, TuneRecord

    nan = math.nan
    return TuneRecord(
        method="heads",
        model=ModelIdentity.of(Checkpoint(tiny("llama"))),
        parameters={"trials": 2},
        study={"storage": "study.db", "sampler": "tpe", "seed": 0},
        objectives={"effect": "ΔS gain", "kl": "first-token KL"},
        split=SplitSizes(
            seed=0,
            test_share=0.5,
            tune_items=["a"],
            test_items=["b"],
            tune_pairs=2,
            test_pairs=1,
            tune_neutral=0,
            test_neutral=0,
        ),
        trials=[
            Trial(number=0, params={"alpha": 2.0, "top": 1}, effect=0.5, kl=nan, heads=[[0, 1]]),
            Trial(number=1, params={"alpha": 3.0, "top": 1}, effect=nan, kl=nan, heads=[[0, 1]]),
        ],
        front=[0],
        chosen=Chosen(number=0, rule="knee"),
        confirmation=HeldOutConfirmation(
            effect=0.25, effect_ci95=[nan, nan], kl=nan, kl_ci95=[nan, nan], delta_s=nan, items=1, neutral=0
        ),
    )


def _same(a, b) -> bool:
    """Two records equal, a missing number (NaN) equal to itself."""
    return finite(a.to_dict()) == finite(b.to_dict())


def test_missing_numbers_are_null_and_read_back_as_nan(tiny, tmp_path, capsys):
    from surgery.cli.tune import print_tune
    from surgery.find.tune.record import read_record, save_record

    record, path = _record(tiny), tmp_path / "tune.json"
    save_record(record, path)
    data = strict(path.read_text())  # raises on NaN
    assert data["confirmation"]["effect_ci95"] == [None, None] and data["trials"][1]["effect"] is None
    back = read_record(path)
    assert all(math.isnan(v) for v in back.confirmation.effect_ci95 + back.confirmation.kl_ci95)
    assert math.isnan(back.trial(1).effect) and math.isnan(back.confirmation.kl)
    assert _same(back, record) and finite(back.to_dict()) == data  # read back the same, key for key

    # tune.json as surgery wrote it before: NaN in the file; it reads as the new one does
    path.write_text(json.dumps(record.to_dict(), indent=1) + "\n")
    assert "NaN" in path.read_text()
    assert _same(read_record(path), back)

    # what computes on the numbers: the note on a CI not above 0 (a NaN bound is not above 0)
    print_tune(back)
    assert "is not shown to work" in " ".join(capsys.readouterr().err.split())
