"""Capture: batched + padded == one prompt at a time; pooling over real tokens; early exit."""

from __future__ import annotations

import pytest
import torch

from surgery.core.errors import SurgeryError
from surgery.find.neurons.capture import capture_pooled
from surgery.model.hooks import layer_module, model_architecture
from tests.support.neuron_capture import TEXTS, load_with_char_tokenizer, reference_pooled


def _captured(model, tok, texts, batch_size, layers=None) -> torch.Tensor:
    parts = []
    capture_pooled(
        model, tok, texts, lambda start, pooled: parts.append((start, pooled)), batch_size=batch_size, layers=layers
    )
    assert [s for s, _ in parts] == list(range(0, len(texts), batch_size))
    return torch.cat([p for _, p in parts])


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "phi3", "gemma3"])
def test_batched_equals_one_at_a_time(tiny, arch):
    model, tok = load_with_char_tokenizer(tiny(arch))
    tok.padding_side = "left"  # capture must pad on the right whatever the tokenizer's default
    reference = torch.stack([reference_pooled(model, tok, t) for t in TEXTS])
    batched = _captured(model, tok, TEXTS, batch_size=4)
    single = _captured(model, tok, TEXTS, batch_size=1)
    width = model_architecture(model).geometry.intermediate_size
    assert batched.shape == (len(TEXTS), model_architecture(model).geometry.num_layers, width)
    assert (batched - reference).abs().max().item() <= 1e-5
    assert (single - reference).abs().max().item() <= 1e-5
    assert reference.abs().max().item() > 1e-3  # activations are not trivially zero


def test_stops_after_last_needed_layer(tiny):
    model, tok = load_with_char_tokenizer(tiny("llama"))
    arch = model_architecture(model)
    calls = {"layer2_mlp": 0, "lm_head": 0}
    layer_module(model, arch, 2, "mlp").register_forward_pre_hook(
        lambda m, a: calls.__setitem__("layer2_mlp", calls["layer2_mlp"] + 1)
    )
    model.lm_head.register_forward_pre_hook(lambda m, a: calls.__setitem__("lm_head", calls["lm_head"] + 1))
    got = _captured(model, tok, TEXTS, batch_size=3, layers=[1, 0])
    assert calls == {"layer2_mlp": 0, "lm_head": 0}
    # every hook is gone: plain forward passes (the reference loop) run to the end
    reference = torch.stack([reference_pooled(model, tok, t) for t in TEXTS])
    assert calls == {"layer2_mlp": len(TEXTS), "lm_head": len(TEXTS)}
    assert (got - reference[:, :2]).abs().max().item() <= 1e-5


def test_hooks_removed_when_the_consumer_fails(tiny):
    model, tok = load_with_char_tokenizer(tiny("llama"))

    def boom(start, pooled):
        raise RuntimeError("consumer failed")

    with pytest.raises(RuntimeError, match="consumer failed"):
        capture_pooled(model, tok, TEXTS, boom, batch_size=2)
    arch = model_architecture(model)
    down = layer_module(model, arch, 2, arch.layout.mlp.down_proj)
    assert not down._forward_pre_hooks


def test_bad_layers_and_batch_size_are_clear_errors(tiny):
    model, tok = load_with_char_tokenizer(tiny("llama"))
    with pytest.raises(SurgeryError, match=r"layers \[3\] do not exist: the model has layers 0..2"):
        capture_pooled(model, tok, TEXTS, lambda s, p: None, layers=[0, 3])
    with pytest.raises(SurgeryError, match="batch size must be ≥ 1"):
        capture_pooled(model, tok, TEXTS, lambda s, p: None, batch_size=0)
