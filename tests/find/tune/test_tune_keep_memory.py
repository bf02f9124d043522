"""tune --keep-memory on the dosed planted-binding model: with no recording kept every trial runs every
layer under its edit, with the same trials, effects and KL as resumed ones; the record holds the
bound, the notes name the option, a study resumes whatever the bound, and a bad value is one line."""

from __future__ import annotations

import pytest

from surgery.core.errors import ParameterError
from surgery.core.optional import available, install_hint
from tests.support.cli import error_line, run_main
from tests.support.planted_tune import BENCHMARK, DOSE, neutral_prompts, truth_findings

pytestmark = pytest.mark.skipif(not available("optuna"), reason=install_hint("optuna"))

SAME = 1e-5  # as test_planted_tune.py: a trial run in full against one resumed from the recordings
OPTIONS = {"benchmark": str(BENCHMARK), "max_pairs": 32, "batch_size": 16, "top_max": 3, "trials": 3}


def test_keeping_nothing_measures_the_same_trials(tmp_path):
    import torch

    import surgery

    torch.set_num_threads(1)
    common = {
        **OPTIONS,
        "findings": truth_findings(tmp_path / "findings.json"),
        "neutral": str(neutral_prompts(tmp_path / "neutral.jsonl")),
    }
    runs = {}
    for keep in ("1GiB", 0):
        lines: list[str] = []
        tuned = surgery.tune(DOSE, out=tmp_path / f"study-{keep}", keep_memory=keep, report=lines.append, **common)
        runs[keep] = tuned.record, lines
    (kept, kept_lines), (bare, bare_lines) = runs["1GiB"], runs[0]
    assert kept.parameters["keep_memory"] == 2**30 and bare.parameters["keep_memory"] == 0
    assert not any("did not fit" in line for line in kept_lines)
    split = kept.split.tune_pairs * 2 + kept.split.tune_neutral  # the tune split's binding and neutral prompts
    assert (
        f"{split:,} of the tune split's {split:,} prompts run every layer in each trial: their recordings did not "
        "fit in 0 B (--keep-memory)"
    ) in bare_lines, bare_lines
    assert any("they keep 0 B of them (--keep-memory)" in line for line in bare_lines), bare_lines
    assert [t.params for t in bare.trials] == [t.params for t in kept.trials]
    for a, b in zip(bare.trials, kept.trials, strict=True):
        assert a.effect == pytest.approx(b.effect, abs=SAME) and a.kl == pytest.approx(b.kl, abs=SAME)
    assert bare.confirmation.effect == pytest.approx(kept.confirmation.effect, abs=SAME)
    # the bound decides the time, not the trials: the study resumes under another one, nothing run again
    lines = []
    again = surgery.tune(DOSE, out=tmp_path / "study-0", keep_memory="2GiB", report=lines.append, **common)
    assert again.record.trials == bare.trials
    assert f"resuming the study in {tmp_path / 'study-0'}: 3 of 3 trials done" in lines


def test_a_bad_bound_is_one_line(capsys):
    from surgery.find.tune.params import TuneParams

    with pytest.raises(ParameterError, match=r"^keep_memory '2 GiBs' is not a size; give e\.g\. 2GiB"):
        TuneParams(keep_memory="2 GiBs")
    line = error_line(run_main(["tune", str(DOSE), "--keep-memory", "-1"], capsys))
    assert line == "Error: --keep-memory '-1' is not a size; give e.g. 2GiB, 512MiB or 8G (0 keeps none)"
