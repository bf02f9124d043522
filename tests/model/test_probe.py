"""A tokenizer or a config that does not fit the model is one line, not an internal error (issue 33,
point 5): the tokenizer is checked against the embedding table as it loads, and a bake (before publishing)
and verify say in one line that a model cannot be built or run (the bake's side: tests/bake/test_runnable.py)."""

from __future__ import annotations

import json
import re

import pytest

import surgery
from surgery.core.errors import CheckpointError
from tests.support.cli import error_line, run_main
from tests.support.neuron_pairs import write_pairs
from tests.support.tokenizer import CHARS, SPECIALS, save_char_tokenizer

ROWS = 96  # the conftest tiny models' vocab_size; the character tokenizer has 101 ids


def _prompts(tmp_path):
    (tmp_path / "a.txt").write_text("the sky is green\nno red is blue\n")
    (tmp_path / "b.txt").write_text("a quiet day\nmost cats sleep\n")
    return tmp_path / "a.txt", tmp_path / "b.txt"


def _refusal(largest: int) -> str:
    return f"has token ids up to {largest} ({largest + 1} tokens) but the model's embedding table has {ROWS} rows"


def test_find_direction_with_a_tokenizer_past_the_embedding_table_is_one_line(tiny, tmp_path, capsys):
    """The reported case: ids beyond vocab_size were an internal IndexError in find-direction."""
    src = save_char_tokenizer(tiny("llama"))
    assert len(SPECIALS + CHARS) > ROWS
    a, b = _prompts(tmp_path)
    args = ["find-direction", src, "--a", a, "--b", b, "--template", "plain", "--out", tmp_path / "d.json"]
    line = error_line(run_main(args, capsys))
    assert _refusal(len(SPECIALS + CHARS) - 1) in line and "not this model's tokenizer" in line
    assert not (tmp_path / "d.json").exists()


def test_find_neurons_in_python_raises_the_project_s_error(tiny, tmp_path):
    """The reported case from Python: a CheckpointError, not a raw IndexError."""
    src = save_char_tokenizer(tiny("llama"))
    with pytest.raises(CheckpointError, match=re.escape(_refusal(len(SPECIALS + CHARS) - 1))):
        surgery.find_neurons(src, pairs=write_pairs(tmp_path / "pairs.jsonl"))


def test_a_smaller_vocabulary_past_a_smaller_table_is_refused_and_added_tokens_are_not(tiny, tmp_path):
    """Variants: 71 ids (letters and digits) for a table of 64 rows is refused; the same ids for 96 rows,
    with one added token past the table (as Gemma 3's text models carry their image token one row past
    theirs), load: text never encodes to the added token."""
    from surgery.model.loading import load_tokenizer
    from tests.support.tokenizer import SMALL_CHARS, char_tokenizer

    small = tiny("llama", vocab_size=64)
    save_char_tokenizer(small, bos=True)
    with pytest.raises(
        CheckpointError, match=r"ids up to 70 \(71 tokens\) but the model's embedding table has 64 rows"
    ):
        load_tokenizer(small)
    src = tiny("llama")
    tok = char_tokenizer(bos=True)
    tok.add_tokens([f"<extra_{i}>" for i in range(ROWS - len(tok) + 1)])  # the last one is row ROWS
    tok.save_pretrained(src)
    loaded = load_tokenizer(src)
    assert len(loaded) == ROWS + 1 and loaded.vocab_size == len(SPECIALS + list(SMALL_CHARS)) < ROWS


def _config(src, **changes):
    config = json.loads((src / "config.json").read_text())
    config.update(changes)
    (src / "config.json").write_text(json.dumps(config))
    return src


@pytest.mark.parametrize(
    "change",
    [{"sliding_window": None}, {"sliding_window": 0}],
    ids=["no-window", "zero-window"],
)
def test_a_model_that_cannot_run_is_one_line_in_the_bake_and_in_verify(tiny, tmp_path, capsys, change):
    """A config transformers builds but cannot run (sliding-window layers without a usable window): the
    bake's run of the source refuses it before publishing; baked without that run (--no-verify), verify's
    logit check says why in one line, where it was an internal error."""
    src = _config(tiny("qwen2"), layer_types=["sliding_attention"] * 3, use_sliding_window=True, **change)
    out = tmp_path / "out"
    bake = ["amplify-heads", src, "--heads", "0.1", "--alpha", "2", "--out", out]
    assert f"the model in {src} cannot run a forward pass (" in error_line(run_main(bake, capsys))
    assert not out.exists()
    assert run_main([*bake, "--no-verify"], capsys).returncode == 0
    line = error_line(run_main(["verify", src, out], capsys))
    assert f"the model in {src} cannot run a forward pass (" in line
    assert run_main(["verify", src, out, "--structural-only"], capsys).returncode == 0
