"""The baking commands that find when they must (amplify-heads, prune-neurons), given none of the
finder's options (issue 33, point 4): they use the newest cached findings of the model, said in one
line, or say up front that the finder runs with its defaults; options given choose exact findings."""

from __future__ import annotations

import json

import pytest

import surgery
from surgery.find.heads import find as heads_find
from surgery.find.neurons import find as neurons_find
from tests.support.binding import FAST, char_model, write_small_benchmark
from tests.support.cli import main_output
from tests.support.neuron_pairs import write_pairs


class Started(Exception):
    """Raised by a finder stand-in: the command went on to compute."""


def _started(*args, **kwargs):
    raise Started


def _no_compute(*args, **kwargs):
    pytest.fail("a finder ran although findings were cached")


def test_amplify_heads_without_options_uses_the_findings_just_computed(tiny, tmp_path, capsys, monkeypatch):
    """The reported case: find-heads --max-pairs … then amplify-heads --alpha 2.5 --top 3 as the README shows."""
    model = char_model(tiny, "llama")
    bench = write_small_benchmark(tmp_path / "small.jsonl")
    code, _, _ = main_output(
        capsys, "find-heads", model, "--benchmark", bench, *FAST, "--seed", "1", "--out", tmp_path / "older.json"
    )
    assert code == 0
    code, out, _ = main_output(capsys, "find-heads", model, "--benchmark", bench, *FAST, "--out", tmp_path / "f.json")
    assert code == 0 and "Saved findings" in out
    newest = json.loads((tmp_path / "f.json").read_text())
    monkeypatch.setattr(heads_find, "find_heads", _no_compute)
    code, out, err = main_output(
        capsys, "amplify-heads", model, "--alpha", "2.5", "--top", "3", "--out", tmp_path / "baked"
    )
    assert code == 0, err
    assert "using the newest cached find-heads findings for this model:" in err
    # the options of the newest (seed 0), and its file (rich may fold a long path: spaces left out)
    assert f"(--benchmark{bench}--max-pairs4--random-sets1)" in err.replace(" ", "")
    record = json.loads((tmp_path / "baked" / "surgery.json").read_text())["heads_findings"]
    older = json.loads((tmp_path / "older.json").read_text())
    assert older["dataset_sha256"] != newest["dataset_sha256"]
    assert record["dataset_sha256"] == newest["dataset_sha256"]  # seed 0's pairs, not seed 1's


def test_amplify_heads_with_nothing_cached_says_up_front_that_find_heads_runs(tiny, tmp_path, monkeypatch):
    model = char_model(tiny, "llama")
    notes, calls = [], []

    def stand_in(ckpt, pairs, params, **kwargs):
        calls.append((len(notes), len(pairs), params))
        raise Started

    monkeypatch.setattr(heads_find, "cached_find_heads", stand_in)
    with pytest.raises(Started):
        surgery.amplify_heads(model, tmp_path / "out", alpha=2.5, callbacks=surgery.Callbacks(report=notes.append))
    assert notes[0].startswith("no find-heads findings are cached for this model: running find-heads with its ")
    ((said, n_pairs, params),) = calls
    assert said == 1 and params.max_pairs is None and n_pairs > 1000  # the defaults, said before the run
    assert "(find-heads says what that takes as it starts)" in notes[0]  # its work: once, by find-heads
    # options given choose the findings: no "newest" rule, the exact key is looked up (and computed)
    notes.clear()
    with pytest.raises(Started):
        surgery.amplify_heads(
            model, tmp_path / "out", alpha=2.5, max_pairs=8, callbacks=surgery.Callbacks(report=notes.append)
        )
    assert notes == [] and calls[-1][2].max_pairs == 8


def test_amplify_heads_with_nothing_cached_says_find_heads_work_once(tiny, tmp_path, monkeypatch):
    """The note says that find-heads runs first; find-heads' own first line says its work: once."""
    model = char_model(tiny, "llama")
    notes = []

    class Stop:  # find-heads' FLOPs counter, built after the work note: the run stops there
        of = staticmethod(_started)

    monkeypatch.setattr(heads_find, "Counter", Stop)
    with pytest.raises(Started):
        surgery.amplify_heads(model, tmp_path / "out", alpha=2.5, callbacks=surgery.Callbacks(report=notes.append))
    assert notes[0].startswith("no find-heads findings are cached for this model: running find-heads")
    work = [n for n in notes if "prompt passes" in n]
    assert len(work) == 1 and " pairs: about " in work[0]  # the defaults' work, said once


def test_prune_neurons_without_capture_options_uses_the_newest_cached(tiny, tmp_path, capsys, monkeypatch):
    model = char_model(tiny, "llama")
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    code, out, _ = main_output(capsys, "find-neurons", model, "--pairs", pairs, "--out", tmp_path / "n.json")
    assert code == 0
    findings = json.loads((tmp_path / "n.json").read_text())
    monkeypatch.setattr(neurons_find, "load_model", _no_compute)
    code, _, err = main_output(capsys, "prune-neurons", model, "--n", "2", "--out", tmp_path / "pruned")
    assert code == 0, err
    assert "using the newest cached find-neurons findings for this model:" in err
    assert f"pairs{pairs},Age,Gender,SES)" in err.replace(" ", "")
    record = json.loads((tmp_path / "pruned" / "surgery.json").read_text())["neuron_findings"]
    assert record["dataset_sha256"] == findings["dataset_sha256"]
    # a capture option given (the builtin pairs, explicitly): those findings, computed as asked
    notes = []
    monkeypatch.setattr(neurons_find, "load_model", _started)
    with pytest.raises(Started):
        surgery.prune_neurons(
            model,
            tmp_path / "other",
            n=2,
            pairs="builtin",
            device="cpu",
            callbacks=surgery.Callbacks(report=notes.append),
        )
    assert not any("newest cached" in n for n in notes)
