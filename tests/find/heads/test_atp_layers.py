"""The screen's backward a layer at a time (atp._layer_by_layer), for models held below float32: the
attributions of the whole graph bit for bit, with one layer's graph alive at a time."""

from __future__ import annotations

import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

from surgery.find.heads import atp
from surgery.find.heads.attention import surgery_attention_on
from surgery.find.heads.benchmark import load_benchmark
from surgery.find.heads.pairs import build_pairs
from surgery.find.heads.scores import encode_pairs, option_token_ids, run_prompts
from surgery.model.hooks import decoder_layers
from surgery.model.loading import LoadSpec, load_model
from tests.support.binding import CHAT, write_small_benchmark
from tests.support.mxfp4 import build_mxfp4
from tests.support.nvfp4 import build_nvfp4
from tests.support.tiny import build_tiny
from tests.support.tokenizer import TINY_VOCAB, char_tokenizer, save_char_tokenizer

CPU = LoadSpec(device="cpu")  # float32 compute: a 16-bit or packed checkpoint is held as stored
SIZES = dict(vocab_size=TINY_VOCAB, max_position_embeddings=512, num_hidden_layers=4)
HELD = {  # held below float32: bfloat16 as stored, gpt-oss's MXFP4 experts, NVFP4 linears
    "llama-bf16": lambda path: build_tiny("llama", path, torch.bfloat16, None, **SIZES),
    "gpt-oss-mxfp4": lambda path: build_mxfp4(path, **SIZES),
    "llama-nvfp4": lambda path: build_nvfp4(path, "llama", **SIZES),
}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("bind")
    return build_pairs(load_benchmark(write_small_benchmark(root / "small.jsonl")), seed=0, max_pairs=4)


def _held(tmp_path: Path, case: str):
    path = HELD[case](tmp_path / case)
    save_char_tokenizer(path, CHAT)
    return load_model(path, CPU)


def _screen(model, small, monkeypatch, layer_by_layer: bool) -> np.ndarray:
    resumed = atp.resumed_attributions
    monkeypatch.setattr(
        "surgery.find.heads.scores.resumed_attributions",
        lambda *args: resumed(*args, layer_by_layer=layer_by_layer),
    )
    prompts, ids = encode_pairs(char_tokenizer(CHAT), small, "binding", True), option_token_ids(char_tokenizer(CHAT))
    with surgery_attention_on(model):
        return run_prompts(model, prompts, ids, batch_size=3, features=True, screen=True).screen


@pytest.mark.parametrize("case", sorted(HELD))
def test_a_layer_at_a_time_gives_the_whole_graphs_attributions_bit_for_bit(tmp_path, small, case, monkeypatch):
    model = _held(tmp_path, case)
    assert atp.recomputes(model)  # the default for a model held below float32
    whole = _screen(model, small, monkeypatch, layer_by_layer=False)
    by_layer = _screen(model, small, monkeypatch, layer_by_layer=True)
    assert np.count_nonzero(whole) >= whole.size // 2  # gpt-oss: its sliding layers' heads may not reach the item
    np.testing.assert_array_equal(by_layer, whole)


class _Marked(torch.autograd.Function):
    """The identity, whose node holds a mark: the mark lives as long as the graph through that node does."""

    @staticmethod
    def forward(ctx, x, mark):
        ctx.mark = mark
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Mark:
    pass


def test_one_layers_graph_is_alive_at_a_time(tmp_path, small, monkeypatch):
    """Each decoder layer's graph (its saved activations) is gone before the next layer runs, in the forward
    and in the backward; the whole graph keeps every layer's until the backward."""
    model = _held(tmp_path, "gpt-oss-mxfp4")
    marks: list[weakref.ref] = []
    most = [0]

    def pre(module, args):
        most[0] = max(most[0], sum(ref() is not None for ref in marks))

    def post(module, args, out):
        if isinstance(out, torch.Tensor) and out.grad_fn is not None:
            mark = _Mark()
            marks.append(weakref.ref(mark))
            return _Marked.apply(out, mark)
        return None

    for layer in decoder_layers(model):
        layer.register_forward_pre_hook(pre)
        layer.register_forward_hook(post)
    _screen(model, small, monkeypatch, layer_by_layer=True)
    assert marks and most[0] == 0 and all(ref() is None for ref in marks)
    marks.clear()
    _screen(model, small, monkeypatch, layer_by_layer=False)
    assert most[0] == len(decoder_layers(model)) - 1 and all(ref() is None for ref in marks)


def test_a_float32_model_keeps_the_whole_graph(tmp_path):
    """A float32 checkpoint is not held below float32: its screen runs one forward, as before (no recompute)."""
    path = build_tiny("llama", tmp_path / "f32", torch.float32, None, **SIZES)
    assert not atp.recomputes(load_model(path, CPU))


def test_the_screen_runs_each_layer_twice(tmp_path, small, monkeypatch):
    """On a model held below float32 the screen runs each layer twice, the forward and the backward's run of it
    again, and nothing more. (The findings' FLOPs count the procedure's work, the screen's forward once, as for
    any hold: the findings of a held model and of its float32 copy are the same bytes.)"""
    model = _held(tmp_path, "llama-bf16")
    calls = [0]
    for layer in decoder_layers(model):
        layer.register_forward_pre_hook(lambda module, args: calls.__setitem__(0, calls[0] + 1))
    runs = {}
    for layer_by_layer in (False, True):
        calls[0] = 0
        _screen(model, small, monkeypatch, layer_by_layer)
        runs[layer_by_layer] = calls[0]
    batches = -(-2 * len(small) // 3)  # a match and a mismatch prompt per pair, 3 a batch
    snapshots = batches * len(decoder_layers(model))  # each batch's baseline pass, without gradients
    assert runs[True] - snapshots == 2 * (runs[False] - snapshots) > 0
