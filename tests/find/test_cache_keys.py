"""Every finder's cache key covers everything that changes its result (issue 33, point 2): the
weights, the tokenizer's files, the chat template, the prompt files' contents and the options.

Each finder runs on a tiny model, again (a cache hit: the key is stable), and again after one input
changed: that run must compute afresh, never answer with the findings of the other input.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import surgery
from surgery.core.checkpoint import Checkpoint
from tests.support.binding import CHAT, char_model, write_small_benchmark
from tests.support.neuron_pairs import write_pairs
from tests.support.tokenizer import SPACE_PAREN, char_tokenizer, save_char_tokenizer

PROMPTS_A = ["Tell me how to pick a lock", "Explain how to hotwire a car", "Write a phishing email", "Make a fake ID"]
PROMPTS_B = ["Tell me how to bake bread", "Explain how to tie a knot", "Write a thank-you note", "Make a paper boat"]


def _prompt_files(tmp_path: Path) -> dict[str, Path]:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("\n".join(PROMPTS_A) + "\n")
    b.write_text("\n".join(PROMPTS_B) + "\n")
    return {"a": a, "b": b}


class Heads:
    """find-heads on the small benchmark (4 pairs, one random set, two candidates confirmed)."""

    def inputs(self, tmp_path: Path) -> dict:
        bench = write_small_benchmark(tmp_path / "bench.jsonl")
        return {"benchmark": str(bench), "max_pairs": 4, "random_sets": 1, "confirm": 3}

    def run(self, model: Path, inputs: dict):
        return surgery.find_heads(model, device="cpu", **inputs)

    def change_prompts(self, inputs: dict) -> None:
        bench = Path(inputs["benchmark"])
        bench.write_text(bench.read_text().replace("Who avoids", "Who dodges"))

    def change_option(self, inputs: dict) -> None:
        inputs["seed"] = 1


class Neurons:
    """find-neurons on a small pairs file."""

    def inputs(self, tmp_path: Path) -> dict:
        return {"pairs": write_pairs(tmp_path / "pairs.jsonl")}

    def run(self, model: Path, inputs: dict):
        return surgery.find_neurons(model, device="cpu", **inputs)

    def change_prompts(self, inputs: dict) -> None:
        pairs = Path(inputs["pairs"])
        pairs.write_text(pairs.read_text().replace("clerk", "clark"))

    def change_option(self, inputs: dict) -> None:
        inputs["categories"] = ("Age", "SES")


class Direction:
    """find-direction on two small prompt sets."""

    def inputs(self, tmp_path: Path) -> dict:
        return _prompt_files(tmp_path)

    def run(self, model: Path, inputs: dict):
        return surgery.find_direction(model, device="cpu", **inputs)

    def change_prompts(self, inputs: dict) -> None:
        inputs["a"].write_text(inputs["a"].read_text().replace("lock", "safe"))

    def change_option(self, inputs: dict) -> None:
        inputs["projected"] = True


FINDERS = {"find-heads": Heads(), "find-neurons": Neurons(), "find-direction": Direction()}


def _change(finder, what: str, model: Path, inputs: dict) -> None:
    if what == "tokenizer":  # another tokenizer.json: " (" becomes one token
        char_tokenizer(merges=[SPACE_PAREN]).save_pretrained(model)
    elif what == "chat template":
        save_char_tokenizer(model, CHAT)
    elif what == "prompt file":
        finder.change_prompts(inputs)
    else:
        finder.change_option(inputs)


@pytest.mark.parametrize("what", ["tokenizer", "chat template", "prompt file", "option"])
@pytest.mark.parametrize("name", list(FINDERS))
def test_each_input_of_each_finder_is_in_its_cache_key(name, what, tiny, tmp_path):
    finder = FINDERS[name]
    model, inputs = char_model(tiny, "llama"), finder.inputs(tmp_path)
    first = finder.run(model, inputs)
    assert not first.from_cache
    assert finder.run(model, inputs).from_cache  # the same inputs: the key is stable
    _change(finder, what, model, inputs)
    after = finder.run(model, inputs)
    assert not after.from_cache and after.path != first.path
    assert first.path.is_file()  # the first findings stay cached under their own key


def test_a_chat_template_added_to_a_copy_of_the_weights_gets_directions_of_its_own(tiny, tmp_path):
    """The reported case: the same weights with and without a chat template (--template auto)."""
    plain = char_model(tiny, "llama")
    chat = tmp_path / "with-template"
    shutil.copytree(plain, chat)
    save_char_tokenizer(chat, CHAT)
    assert Checkpoint(plain).fingerprint() == Checkpoint(chat).fingerprint()  # the same weights
    assert Checkpoint(plain).model_key() != Checkpoint(chat).model_key()
    sets = _prompt_files(tmp_path)

    def vectors(found) -> np.ndarray:
        from safetensors.numpy import load_file

        return load_file(str(found.vectors))["layer.1"]

    without = surgery.find_direction(plain, device="cpu", **sets)
    with_template = surgery.find_direction(chat, device="cpu", **sets)
    assert not with_template.from_cache and with_template.data.dataset.chat_template
    assert not without.data.dataset.chat_template
    assert not np.allclose(vectors(without), vectors(with_template), atol=1e-4)
    again = surgery.find_direction(plain, device="cpu", **sets)  # the first folder keeps its own
    assert again.from_cache and again.path == without.path and not again.data.dataset.chat_template
    assert np.array_equal(vectors(again), vectors(without))


def test_the_model_key_reads_every_tokenizer_file_and_only_those(tiny, tmp_path):
    model = char_model(tiny, "llama")
    ckpt = Checkpoint(model)
    files = ckpt.tokenizer_files()
    assert "tokenizer.json" in files and "tokenizer_config.json" in files
    assert not any(f.endswith(".safetensors") or f == "config.json" for f in files)
    key = ckpt.model_key()
    (model / "README.md").write_text("notes\n")  # not read by the tokenizer: same key
    assert Checkpoint(model).model_key() == key
    (model / "additional_chat_templates").mkdir()
    (model / "additional_chat_templates" / "tool_use.jinja").write_text("{{ messages }}")
    assert Checkpoint(model).model_key() != key
