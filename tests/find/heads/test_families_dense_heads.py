"""find-heads on the dense families of issue 24: the registered attention function computes what
eager attention does (MHA without num_key_value_groups, attention sinks), or the family says in one
line that it cannot switch its attention function; resumed knockout and whole-head passes equal full
passes (GPT-2's positional layer calls, OPT's decoder, the table's tails: no final norm, prediction
head, logit multiplier, divisor, soft-cap); findings computed end to end and their heads baked."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from packaging.version import Version

import surgery
from surgery.core.edits import HeadScale
from surgery.core.errors import SurgeryError
from surgery.find.heads.attention import AttentionPlan, EdgeEdit, active_plan, edge_heads, surgery_attention_on
from surgery.find.heads.benchmark import load_benchmark
from surgery.find.heads.causal import PairRunner, random_head_sets
from surgery.find.heads.pairs import build_pairs
from surgery.find.heads.scores import encode_pairs, option_token_ids, run_prompts
from surgery.model.hooks import applied
from surgery.model.loading import load_model
from tests.support.binding import CHAT, write_small_benchmark
from tests.support.dense_families import CASES, build_family, family_config
from tests.support.tokenizer import TINY_VOCAB, char_tokenizer, save_char_tokenizer

TYPES = sorted({t: c for c, (t, _) in reversed(CASES.items())}.values())
# Families whose attention is not built on transformers' AttentionInterface (find-heads refuses them
# in one line; their heads are still baked, verified and exported like any other's).
NO_INTERFACE = {"bloom", "cpmant", "gpt_neo", "gpt_neox_japanese", "mpt", "openai-gpt", "xglm"}
if Version(transformers.__version__) < Version("5.25"):  # Falcon's attention moved onto the interface in 5.25
    NO_INTERFACE.add("falcon")
SAME = 1e-5


@pytest.mark.parametrize("case", TYPES)
def test_surgery_attention_equals_eager_or_is_refused(case):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(family_config(case)).eval()
    model.set_attn_implementation("eager")
    ids = torch.randint(3, 90, (2, 9), generator=torch.Generator().manual_seed(0))
    att = torch.ones_like(ids)
    att[1, :2] = 0
    masks = {
        "item": torch.zeros_like(ids, dtype=torch.bool),
        "a": torch.zeros_like(ids, dtype=torch.bool),
        "b": torch.zeros_like(ids, dtype=torch.bool),
    }
    masks["item"][:, 3:5], masks["a"][:, 6:7], masks["b"][:, 8:9] = True, True, True
    with torch.inference_mode():
        eager = model(input_ids=ids, attention_mask=att).logits
        if case in NO_INTERFACE:
            with pytest.raises(
                SurgeryError,
                match=r"^\w+ cannot switch its attention function; binding features "
                r"and edge edits need a model built on transformers' "
                r"AttentionInterface$",
            ):
                with surgery_attention_on(model):
                    pass
            return
        with surgery_attention_on(model), active_plan(AttentionPlan(masks, features=True)):
            featured = model(input_ids=ids, attention_mask=att).logits
    assert (featured - eager).abs().max().item() <= 1e-6


def test_attention_sinks_of_gpt_oss():
    """GPT-OSS passes its sinks as ``s_aux`` too: the function was eager minus the sinks before."""
    from transformers import AutoModelForCausalLM

    from tests.support.tiny import tiny_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("gpt_oss")).eval()
    with torch.no_grad():
        model.model.layers[0].self_attn.sinks.normal_()  # initialised to zero-ish: make them matter
    model.set_attn_implementation("eager")
    ids = torch.randint(3, 90, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        eager = model(input_ids=ids).logits
        with surgery_attention_on(model):
            ours = model(input_ids=ids).logits
    assert (ours - eager).abs().max().item() <= 1e-6


def _char_family(case: str, path):
    build_family(case, path, vocab_size=TINY_VOCAB, max_position_embeddings=512)
    save_char_tokenizer(path, CHAT)
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("bind")
    return build_pairs(load_benchmark(write_small_benchmark(root / "small.jsonl")), seed=0, max_pairs=4)


# GPT-2 (positional layer calls, Conv1D), GPT-NeoX, OPT (model.decoder), Phi, ModernBERT (prediction
# head), Cohere (logit multiplier), Granite (divisor), nanochat (soft-cap), Granite-SWA (attention sinks)
RESUMED = ("gpt2", "gpt_neox", "opt", "phi", "modernbert-decoder", "cohere", "granite", "nanochat", "granite_swa")


@pytest.mark.parametrize("case", RESUMED)
def test_resumed_passes_equal_full_passes(tmp_path, small, case):
    model, tok = load_model(_char_family(case, tmp_path / case)), char_tokenizer(CHAT)
    cfg = model.config.get_text_config()
    layers, heads = cfg.num_hidden_layers, cfg.num_attention_heads
    sets = random_head_sets(layers, heads, 2, 2, [], seed=1)
    edits = [
        EdgeEdit(edge_heads([(0, 1)]), 0.0),
        EdgeEdit(edge_heads([(layers - 1, 2)]), 0.0),
        EdgeEdit(edge_heads(sets[0]), 2.0),
    ]
    scales = [(HeadScale(0, 1, 2.5),), (HeadScale(layers - 1, heads - 1, 0.0),)]
    with surgery_attention_on(model):
        runner = PairRunner(
            model,
            encode_pairs(tok, small, "binding", True),
            [p.item for p in small],
            option_token_ids(tok),
            batch_size=3,
        )
        swept = runner.sweep([*edits, *scales])
        full = [run_prompts(model, runner.prompts, runner.ids, batch_size=3, edit=e).s for e in edits]
        for sc in scales:
            with applied(model, sc):
                full.append(run_prompts(model, runner.prompts, runner.ids, batch_size=3, share_prefixes=False).s)
    for s, f in zip(swept, full):
        np.testing.assert_allclose(s, f, atol=SAME, rtol=0)
    assert any(not np.allclose(f, runner.base, atol=1e-4) for f in full)  # the edits do change S


def test_find_heads_and_amplify_on_gpt2(tmp_path):
    """find-heads end to end on GPT-2 (Conv1D c_proj), then its top heads amplified: verified."""
    from surgery.bake.verify import verify
    from surgery.core.checkpoint import Checkpoint

    model = _char_family("gpt2", tmp_path / "gpt2")
    bench = str(write_small_benchmark(tmp_path / "bench.jsonl"))
    options = dict(benchmark=bench, max_pairs=4, random_sets=1, confirm=0)
    found = surgery.find_heads(model, **options)
    assert found.data.to_dict()["model"]["model_type"] == "gpt2"
    baked = surgery.amplify_heads(model, tmp_path / "amplified", alpha=2.5, top=2, **options)
    assert baked.tensors_edited > 0
    assert verify(Checkpoint(model), tmp_path / "amplified").ok
