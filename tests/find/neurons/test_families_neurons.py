"""find-neurons on hybrid and MLA models: scores for every layer where each has a dense MLP (MLA, linear
attention, convolution, state-space and MLA-hybrid layers alike), pruning the top neurons bakes a
checkpoint equal to its twin; a model some of whose layers have no dense MLP is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from surgery.core.errors import UnsupportedArchitecture
from tests.support.families import build_family
from tests.support.neuron_pairs import write_pairs
from tests.support.tokenizer import TINY_VOCAB, save_char_tokenizer


def _char_model(model_type: str, path, **overrides):
    path = build_family(model_type, path, vocab_size=TINY_VOCAB, max_position_embeddings=512, **overrides)
    save_char_tokenizer(path)
    return path


# Jamba without experts (its expert period past the last layer): the dense MLP of every kind of layer;
# find-neurons through experts: tests/find/neurons/test_moe_families.py
DENSE = {"jamba": dict(expert_layer_period=5, expert_layer_offset=4)}


@pytest.mark.parametrize("model_type", ["minicpm3", "qwen3_5_text", "lfm2", "jamba"])
def test_find_neurons_then_prune_on_each_shape(tmp_path, model_type):
    import surgery

    model = _char_model(model_type, tmp_path / "m", **DENSE.get(model_type, {}))
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    scores = surgery.find_neurons(model, pairs=pairs).scores
    bias = np.stack(list(scores.bias.values()))
    assert bias.shape[1] == 4 and np.isfinite(bias).all() and (bias > 0).any(axis=-1).all()  # every layer scored
    surgery.prune_neurons(model, tmp_path / "pruned", n=5, pairs=pairs)
    report = surgery.verify(model, tmp_path / "pruned")
    assert report.ok and report.max_abs_logit_diff <= 1e-5, report.problems


def test_find_neurons_refuses_layers_without_a_dense_mlp(tmp_path):
    import surgery

    model = _char_model("nemotron_h", tmp_path / "m")  # state-space, attention, MLP, attention
    with pytest.raises(UnsupportedArchitecture) as exc:
        surgery.find_neurons(model, pairs=write_pairs(tmp_path / "pairs.jsonl"))
    msg = str(exc.value)
    assert "\n" not in msg and "layers 0, 1, 3" in msg and "'full_attention' and 'linear_attention'" in msg
