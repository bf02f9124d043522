"""--keep-memory: the bound on the baseline passes find-heads keeps between sweeps. A smaller one keeps
fewer batches (said once, naming the option) and reruns their baseline pass in each sweep: the same
findings, recorded with the bound; the findings' cache key leaves it out; a bad value is one line."""

from __future__ import annotations

import numpy as np
import pytest

from surgery.core.checkpoint import Checkpoint
from surgery.core.errors import ParameterError
from surgery.find.heads import causal
from surgery.find.heads import find as heads_find
from surgery.find.heads.benchmark import load_benchmark
from surgery.find.heads.pairs import build_pairs
from surgery.find.heads.params import FindParams
from surgery.model.loading import LoadSpec
from tests.support.binding import char_model, write_small_benchmark
from tests.support.cli import error_line, run_main

SAME = 1e-5  # as tests/find/heads/test_resume.py: a rerun baseline pass against a kept one
CPU = LoadSpec(device="cpu")
# 6 pairs, 12 binding prompts in batches of 3: 4 batches to keep; one confirmation sweep, then the knockouts
OPTIONS = {"max_pairs": 6, "batch_size": 3, "random_sets": 2, "confirm": 2, "knockout_heads": 2}


def _run(model, pairs, keep_memory, monkeypatch) -> tuple[dict, causal.PairRunner, list[str]]:
    """find-heads' findings with ``keep_memory``, its PairRunner and its notes."""
    runners: list[causal.PairRunner] = []

    class Seen(causal.PairRunner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            runners.append(self)

    monkeypatch.setattr(heads_find, "PairRunner", Seen)
    notes: list[str] = []
    params = FindParams(**OPTIONS, keep_memory=keep_memory)
    found = heads_find.find_heads(model, pairs, params, load=CPU, report=notes.append).to_dict()
    return found, runners[0], notes


def test_a_smaller_bound_keeps_fewer_passes_and_finds_the_same(tiny, tmp_path, monkeypatch):
    model = char_model(tiny, "llama")
    pairs = build_pairs(load_benchmark(write_small_benchmark(tmp_path / "small.jsonl")), seed=0, max_pairs=6)
    every, all_kept, notes = _run(model, pairs, "1GiB", monkeypatch)
    batches = len(all_kept.kept)
    assert batches == 4 and not any("--keep-memory" in n for n in notes)
    one = max(snap.nbytes() for snap in all_kept.kept.values())  # room for one batch, not two
    runs = {"0": _run(model, pairs, 0, monkeypatch), "one batch": _run(model, pairs, one, monkeypatch)}
    for name, (found, runner, notes) in runs.items():
        assert len(runner.kept) == (0 if name == "0" else 1) and runner.kept_bytes <= runner.keep_bytes
        said = [n for n in notes if "--keep-memory" in n]
        assert said == [
            f"the baseline passes take more than the {'0 B' if name == '0' else causal.human_size(one)} they may "
            "keep (--keep-memory): the batches past it run theirs again in each sweep (slower, the same findings)"
        ], notes
        # the findings record the bound, in bytes; everything else is the same run's
        assert found["parameters"].pop("keep_memory") == (0 if name == "0" else one)
        assert every["parameters"]["keep_memory"] == 2**30
        assert found["selected_heads"] == every["selected_heads"]
        assert [h["head"] for h in found["confirmation"]["heads"]] == [
            h["head"] for h in every["confirmation"]["heads"]
        ]
        for key in ("tested", "control"):
            for field in ("delta_base", "delta_knockout", "effect_pct"):
                assert found["knockout"][key][field] == pytest.approx(every["knockout"][key][field], abs=SAME)
        np.testing.assert_allclose(
            [r["effect_pct"] for r in found["confirmation"]["heads"]],
            [r["effect_pct"] for r in every["confirmation"]["heads"]],
            atol=SAME,
        )
        # a baseline pass that is not kept is run again in each later sweep: more FLOPs, the same findings
        assert found["cost"]["forward_flops"] > every["cost"]["forward_flops"]


def test_the_bound_is_left_out_of_the_findings_cache_key(tiny, tmp_path):
    """Findings cached before the option (or with another bound) are found again: it decides the run's
    memory and time, not the findings."""
    model = Checkpoint(char_model(tiny, "llama"))
    pairs = build_pairs(load_benchmark(write_small_benchmark(tmp_path / "small.jsonl")), seed=0, max_pairs=6)
    default = heads_find.findings_cache(model, pairs, FindParams())
    assert heads_find.findings_cache(model, pairs, FindParams(keep_memory="8G")) == default
    assert heads_find.findings_cache(model, pairs, FindParams(seed=1)) != default
    assert FindParams(keep_memory="8G").keep_memory == 8 * 2**30 and FindParams().keep_memory == causal.KEEP_BYTES


@pytest.mark.parametrize("value", ["lots", "-1", "2XB", "inf"])
def test_a_bad_bound_is_one_line(value, tiny, capsys):
    with pytest.raises(ParameterError, match=rf"^keep_memory '{value}' is not a size; give e\.g\. 2GiB, 512MiB"):
        FindParams(keep_memory=value)
    line = error_line(run_main(["find-heads", tiny("llama"), "--keep-memory", value], capsys))
    assert line == f"Error: --keep-memory '{value}' is not a size; give e.g. 2GiB, 512MiB or 8G (0 keeps none)"


class Started(Exception):
    """Raised by a find-heads stand-in: amplify-heads went on to find heads."""


def test_amplify_heads_hands_the_bound_to_find_heads_and_chooses_no_findings_by_it(tiny, tmp_path, monkeypatch, capsys):
    """amplify-heads runs find-heads' passes when no findings are cached: --keep-memory reaches them, and
    given alone it leaves the rule of no find-heads option (the newest cached findings, else the defaults)."""
    import surgery

    model, notes, calls = char_model(tiny, "llama"), [], []

    def stand_in(ckpt, pairs, params, **kwargs):
        calls.append(params)
        raise Started

    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(heads_find, "cached_find_heads", stand_in)
    with pytest.raises(Started):
        surgery.amplify_heads(
            model, tmp_path / "out", alpha=2.5, keep_memory="1GiB", callbacks=surgery.Callbacks(report=notes.append)
        )
    assert notes[0].startswith("no find-heads findings are cached for this model: running find-heads with its ")
    assert calls[-1].keep_memory == 2**30 and calls[-1].max_pairs is None  # the defaults, with the bound
    result = run_main(
        ["amplify-heads", model, "--alpha", "2.5", "--keep-memory", "512MiB", "--out", tmp_path / "o"], capsys
    )
    assert result.returncode != 0 and calls[-1].keep_memory == 512 * 2**20  # the stand-in stopped it there
