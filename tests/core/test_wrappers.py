"""Multimodal wrappers: surgery edits the text decoder and copies the vision or audio tower byte for
byte (the coverage sweep proves each wrapper row; tests/support/coverage.py ``prove``); here the
variants a row must also cover, and find-neurons / find-heads run on the wrapper's text model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import surgery
from surgery.core.architectures import architecture
from surgery.core.checkpoint import Checkpoint
from tests.support.binding import write_small_benchmark
from tests.support.coverage import build_family, prove, save_family, tiny_family_config
from tests.support.models import stored_tensors
from tests.support.neuron_pairs import write_pairs
from tests.support.tokenizer import save_char_tokenizer

# transformers 5 saves a llava-style wrapper as older releases did (language_model.model.layers.N,
# vision_tower.…); checkpoints written by transformers 4.5x hold the names it uses in memory.
IN_MEMORY = (
    ("language_model.model.", "model.language_model."),
    ("language_model.lm_head.", "lm_head."),
    ("", "model."),
)


def _respelled(src, dst):
    """``src`` (saved by transformers 5) under the names transformers 4.5x wrote."""
    from safetensors.torch import save_file

    def new(name: str) -> str:
        old, now = next((o, n) for o, n in IN_MEMORY if name.startswith(o))
        return now + name[len(old) :]

    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    save_file(
        {new(k): v.contiguous() for k, v in stored_tensors(src).items()},
        str(dst / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return dst


def test_mistral3_with_a_ministral3_text_decoder(tmp_path):
    """Ministral-3 releases wrap a ministral3 text model in mistral3: the same row, proven."""
    model = build_family("mistral3", text_config=tiny_family_config("ministral3"))
    assert model.config.text_config.model_type == "ministral3"
    prove(model, tmp_path)


def test_both_spellings_of_the_text_layers(tmp_path):
    """transformers 5 saves Mistral-3 as language_model.model.layers.N (the sweep proves that one);
    checkpoints of transformers 4.5x hold model.language_model.layers.N, model.vision_tower.…: the
    row's other prefix, which the bake, its checks and the LoRA export follow as stored."""
    model = build_family("mistral3")
    saved = save_family(model, tmp_path / "saved")
    assert (
        architecture(Checkpoint(saved).config).layer_prefix(Checkpoint(saved).tensors)
        == "language_model.model.layers.{layer}."
    )
    src = _respelled(saved, tmp_path / "4.5x")
    names = Checkpoint(src).tensors
    assert architecture(Checkpoint(src).config).layer_prefix(names) == "model.language_model.layers.{layer}."
    assert any(n.startswith("model.vision_tower.") for n in names) and "lm_head.weight" in names
    prove(model, tmp_path, src=src)


@pytest.mark.parametrize(
    "model_type",
    [
        "mistral3",
        "got_ocr2",
        pytest.param("moss_transcribe_diarize", marks=pytest.mark.slow(minutes=0.5)),
        pytest.param("gemma3", marks=pytest.mark.slow(minutes=0.5)),
    ],
)
def test_find_neurons_and_find_heads_on_the_text_decoder(tmp_path, model_type):
    """Both finders run on the wrapper's text model; what they find bakes into the text decoder alone
    and verifies end to end (baked logits == run-time edit). Mistral-3 loads as image-text-to-text;
    GOT-OCR2's vision encoder has eager attention only, so find-heads switches the text decoder's."""
    src = save_char_tokenizer(save_family(build_family(model_type), tmp_path / "src"))
    g = architecture(Checkpoint(src).config).geometry
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    found = surgery.find_neurons(src, pairs=pairs)
    bias = np.stack(list(found.scores.bias.values()))
    assert bias.shape[1:] == (g.num_layers, g.intermediate_size) and np.isfinite(bias).all() and bias.any()
    baked = surgery.prune_neurons(src, tmp_path / "pruned", n=5, pairs=pairs)
    assert len(baked.provenance.recipe.edits) == 5
    assert surgery.verify(src, tmp_path / "pruned").ok

    bench = write_small_benchmark(tmp_path / "small.jsonl")
    heads = surgery.find_heads(src, benchmark=str(bench), max_pairs=4, random_sets=1)
    chosen = heads.select(2)
    assert len(chosen) == 2 and all(0 <= layer < g.num_layers and 0 <= h < g.num_heads for layer, h in chosen)
    surgery.amplify_heads(src, tmp_path / "amplified", alpha=2.5, heads=chosen)
    report = surgery.verify(src, tmp_path / "amplified")
    assert report.ok and report.max_abs_logit_diff <= 1e-5, report.problems
    text = architecture(Checkpoint(src).config).layer_prefix(Checkpoint(src).tensors).split("layers.")[0]
    before, after = stored_tensors(src), stored_tensors(tmp_path / "amplified")
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(n.startswith(text) for n in changed)
