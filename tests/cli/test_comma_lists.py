"""Comma-separated options: an empty item (``2,,3``, a comma at an end) and a head or neuron named
twice are refused in one line that names the option and the item, never skipped."""

from __future__ import annotations

import pytest

import surgery
from surgery.core.errors import ParameterError, RecipeError
from tests.support.cli import error_line, run_main

HEADS = ["amplify-heads", "--heads", "0.1"]


@pytest.mark.parametrize(
    "args, message",
    [
        ([*HEADS, "--alpha", "2,,3"], "--alpha '2,,3': item 2 of 3 is empty"),
        ([*HEADS, "--alpha", "2,3,"], "--alpha '2,3,': item 3 of 3 is empty"),
        (["amplify-heads", "--heads", "0.1,,0.2", "--alpha", "2"], "--heads '0.1,,0.2': item 2 of 3 is empty"),
        (["prune-neurons", "--n", ",20"], "--n ',20': item 1 of 2 is empty"),
        (["prune-neurons", "--neurons", "0:3,,0:4"], "--neurons '0:3,,0:4': item 2 of 3 is empty"),
        (["prune-neurons", "--n", "2", "--category", "Gender,,Age"], "--category 'Gender,,Age': item 2 of 3 is empty"),
        (
            [*HEADS, "--alpha", "2", "--device-map", "auto", "--max-memory", "cpu=1GB,"],
            "--max-memory 'cpu=1GB,': item 2 of 2 is empty",
        ),
        (
            ["amplify-heads", "--heads", "0.1,0.2,0.1", "--alpha", "2"],
            "--heads names head 0.1 twice; give each head once",
        ),
        (["prune-neurons", "--neurons", "0:3, 0:3"], "--neurons names neuron 0:3 twice; give each neuron once"),
    ],
)
def test_an_empty_or_repeated_item_is_refused_in_one_line(args, message, tiny, tmp_path, capsys):
    command, *rest = args
    line = error_line(run_main([command, tiny("llama"), *rest, "--out", tmp_path / "o"], capsys))
    assert line.startswith(f"Error: {message}"), line
    assert not (tmp_path / "o").exists()


def test_eval_lm_eval_tasks_refuse_an_empty_item(tiny, capsys):
    line = error_line(run_main(["eval", tiny("llama"), "--lm-eval", "hellaswag,,arc_easy"], capsys))
    assert line.startswith("Error: --lm-eval 'hellaswag,,arc_easy': item 2 of 3 is empty"), line


def test_python_lists_refuse_a_repeat_across_their_items(tiny, tmp_path):
    model = tiny("llama")
    with pytest.raises(ParameterError, match=r"^heads names head 0\.1 twice"):
        surgery.amplify_heads(model, tmp_path / "o", heads=[(0, 1), "0.2,0.1"], alpha=2.0)
    with pytest.raises(ParameterError, match="^neurons names neuron 0:3 twice"):
        surgery.prune_neurons(model, tmp_path / "o", neurons=["0:3", (0, 3)])
    with pytest.raises(RecipeError, match="^heads '0.1,': item 2 of 2 is empty"):
        surgery.amplify_heads(model, tmp_path / "o", heads="0.1,", alpha=2.0)
