"""evaluation.prefill: an edited generation that replays the unedited prefill below the edit's lowest
layer gives the full generation's tokens and logits bit for bit, and really skips those layers' prefill."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from surgery.core.edits import HeadScale
from surgery.evaluation.prefill import Prefills, lowest_layer
from surgery.model.hooks import applied, decoder_layers
from surgery.model.loading import load_model

NEW_TOKENS = 6
TEXTS = ("first", "second", "third")  # the key a batch is recorded under


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three left-padded rows of random tokens (3 to 8 of them)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 90, (3, 8), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :5], mask[1, :2] = 0, 0
    return ids.masked_fill(mask == 0, 0), mask


def _generate(model, around=None):
    """Greedy tokens and every step's logits (``around``: the context the generation runs in)."""
    ids, mask = _batch()
    with torch.inference_mode(), around if around is not None else nullcontext():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
            return_dict_in_generate=True,
            output_logits=True,
        )
    return out.sequences, torch.stack(out.logits)


def _mlp_calls(model, layer: int) -> list[int]:
    """A counter of layer ``layer``'s MLP calls (a replayed prefill does not run it)."""
    calls = [0]
    mlp = decoder_layers(model)[layer].mlp
    mlp.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("layer", [0, 2, 3])
def test_a_replayed_prefill_gives_the_full_generation(tiny, layer):
    torch.set_num_threads(1)
    model = load_model(tiny("llama", num_hidden_layers=4))
    prefills = Prefills()
    with prefills.recording(model, TEXTS):
        base = _generate(model)
    edits = [HeadScale(layer, 1, 0.0), HeadScale(3, 0, 1.5)]
    assert lowest_layer(model, edits) == layer
    with applied(model, edits):
        full = _generate(model)
        calls = _mlp_calls(model, 0)
        fast = _generate(model, prefills.replaying(model, TEXTS, lowest_layer(model, edits)))
    assert not torch.equal(full[1], base[1])  # the edit changes the logits
    assert torch.equal(fast[0], full[0]) and torch.equal(fast[1], full[1])
    # layer 0's prefill is skipped when the edit starts above it: its MLP runs for the decode steps only
    assert calls[0] == (NEW_TOKENS - 1 if layer > 0 else NEW_TOKENS)
    assert all("forward" not in block.__dict__ for block in decoder_layers(model))


def test_a_batch_recorded_elsewhere_or_a_sliding_cache_is_generated_in_full(tiny):
    torch.set_num_threads(1)
    model = load_model(tiny("gemma3_text", num_hidden_layers=4))  # sliding-window layers: not replayed
    prefills = Prefills()
    with prefills.recording(model, TEXTS):
        _generate(model)
    assert prefills.batches[TEXTS] is None
    edits = [HeadScale(2, 1, 0.0)]
    with applied(model, edits):
        full = _generate(model)
        for key in (TEXTS, ("another",)):
            fast = _generate(model, prefills.replaying(model, key, lowest_layer(model, edits)))
            assert torch.equal(fast[0], full[0]) and torch.equal(fast[1], full[1])


def test_the_lowest_layer_of_an_edit_next_to_the_layers_is_0(tiny):
    import numpy as np

    from surgery.core.direction_edit import DirectionEdit

    model = load_model(tiny("llama", num_hidden_layers=4))
    unit = (np.ones(32, np.float32) / np.sqrt(32)).tobytes()
    embeddings = DirectionEdit(module="embeddings", vector="v.safetensors#r", weight=1.0, unit=unit)
    assert lowest_layer(model, [HeadScale(3, 0, 0.5), embeddings]) == 0
    assert lowest_layer(model, [HeadScale(3, 0, 0.5), HeadScale(2, 1, 0.0)]) == 2
    assert lowest_layer(model, []) == 4  # nothing edited: every layer's prefill is the unedited one
