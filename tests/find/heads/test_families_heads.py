"""find-heads on the new attention shapes: MLA (q·k heads wider than v heads), attention sinks, DeepSeek
sparse attention, sliding windows and hybrid models (heads in the attention layers only).

The surgery attention function without a plan computes what eager attention computes; resumed knockout
passes give the full passes' S (hybrid models rerun every position: their cache is not keys and values
only; DeepSeek-V2's rotary embedding is one complex tensor; Hunyuan-V4's layers hand each other their
top-k keys, so its passes run in full); find-heads runs end to end on a tiny model of each shape, its
findings name attention layers only, and the found heads bake into a checkpoint equal to their twin.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from surgery.core.architectures import architecture
from surgery.core.checkpoint import Checkpoint
from surgery.core.errors import UnsupportedArchitecture
from surgery.find.heads.attention import EdgeEdit, edge_heads, surgery_attention_on
from surgery.find.heads.benchmark import load_benchmark
from surgery.find.heads.causal import PairRunner, random_head_sets
from surgery.find.heads.pairs import build_pairs
from surgery.find.heads.scores import encode_pairs, option_token_ids, run_prompts
from surgery.model.hooks import model_architecture
from surgery.model.loading import load_model
from tests.support.binding import CHAT, FAST, write_small_benchmark
from tests.support.families import FAMILIES, build_family
from tests.support.tiny import build_tiny
from tests.support.tokenizer import TINY_VOCAB, char_tokenizer, save_char_tokenizer

SAME = 1e-5  # S agreement of a resumed pass with a full pass (fp32 summation order only)


def _build(model_type: str, path, **overrides):
    return (build_family if model_type in FAMILIES or model_type == "qwen3_5" else build_tiny)(
        model_type, path, **overrides
    )


@pytest.mark.parametrize(
    "model_type", ["gpt_oss", "hy_v4", "deepseek_v32", "minicpm3", "qwen3_5_text", "recurrent_gemma", "mistral"]
)
def test_no_plan_equals_eager(tmp_path, model_type):
    """Sinks (GPT-OSS, Hunyuan-V4: one more logit per row), DeepSeek sparse attention (each query's
    top-k keys), MLA, linear-attention and recurrent hybrids, sliding windows: as eager attention."""
    model = load_model(_build(model_type, tmp_path / "m"))
    model.set_attn_implementation("eager")
    ids = torch.randint(3, 90, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        eager = model(input_ids=ids).logits
        with surgery_attention_on(model):
            ours = model(input_ids=ids).logits
    assert torch.equal(eager, ours)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("bind")
    return build_pairs(load_benchmark(write_small_benchmark(root / "small.jsonl")), seed=0, max_pairs=4)


def _char_model(model_type: str, path, chat: str | None = None):
    # RecurrentGemma's window would otherwise keep the item out of the options' reach
    window = {"attention_window_size": 512} if model_type == "recurrent_gemma" else {}
    path = _build(model_type, path, vocab_size=TINY_VOCAB, max_position_embeddings=512, **window)
    save_char_tokenizer(path, chat)
    return path


@pytest.mark.parametrize(
    "model_type", ["qwen3_5_text", "nemotron_h", "recurrent_gemma", "minicpm3", "deepseek_v2", "hy_v4"]
)
def test_resumed_knockouts_equal_full_passes(tmp_path, small, model_type):
    model, tok = load_model(_char_model(model_type, tmp_path / "m", CHAT)), char_tokenizer(CHAT)
    layers, heads = model_architecture(model).head_layers(), model.config.get_text_config().num_attention_heads
    edits = [EdgeEdit(edge_heads([(layers[0], 1)]), 0.0), EdgeEdit(edge_heads([(layers[-1], 2)]), 2.0)] + [
        EdgeEdit(edge_heads(s), 0.0) for s in random_head_sets(layers, heads, 2, 2, [], seed=1)
    ]
    with surgery_attention_on(model):
        runner = PairRunner(
            model,
            encode_pairs(tok, small, "binding", True),
            [p.item for p in small],
            option_token_ids(tok),
            batch_size=3,
        )
        swept = runner.sweep(edits)
        full = [run_prompts(model, runner.prompts, runner.ids, batch_size=3, edit=e).s for e in edits]
    for s, f in zip(swept, full):
        np.testing.assert_allclose(s, f, atol=SAME, rtol=0)
    assert max(np.abs(f - runner.base).max() for f in full) > 1e-5  # the knockouts do something


@pytest.mark.parametrize("model_type", ["minicpm3", "qwen3_5", "nemotron_h", "gemma2"])
def test_find_heads_then_amplify_on_each_shape(tmp_path, model_type):
    """MLA, a hybrid multimodal wrapper, a Mamba/attention/MLP hybrid, sliding windows with soft-caps:
    findings computed over the attention layers, the found heads baked equal to their twin."""
    import surgery

    model = _char_model(model_type, tmp_path / "m")
    bench = write_small_benchmark(tmp_path / "small.jsonl")
    options = dict(benchmark=str(bench), max_pairs=int(FAST[1]), random_sets=int(FAST[3]))
    found = surgery.find_heads(model, **options).data.to_dict()
    arch = architecture(Checkpoint(model).config)
    layers = {h["layer"] for h in found["discovery"]["heads"]}
    assert layers == set(arch.head_layers())
    assert len(found["discovery"]["heads"]) == len(arch.head_layers()) * arch.geometry.num_heads
    assert {layer for layer, _ in found["selected_heads"]} <= set(arch.head_layers())
    assert all(layer in arch.head_layers() for s in found["knockout"]["random_sets"] for layer, _ in s["heads"])
    surgery.amplify_heads(model, tmp_path / "baked", alpha=2.5, top=2, **options)
    report = surgery.verify(model, tmp_path / "baked")
    assert report.ok and report.max_abs_logit_diff <= 1e-5, report.problems


def test_find_heads_refuses_deepseek_v4_before_loading(tmp_path, monkeypatch):
    import surgery
    from surgery.find.heads import find

    model = _char_model("deepseek_v4", tmp_path / "m")
    monkeypatch.setattr(find, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(UnsupportedArchitecture) as exc:
        surgery.find_heads(model, benchmark=str(write_small_benchmark(tmp_path / "s.jsonl")), max_pairs=4)
    assert "\n" not in str(exc.value) and "compressed blocks of keys" in str(exc.value)
