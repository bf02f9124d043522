"""Tiny random models of every supported architecture, built from config objects (no network)."""

from __future__ import annotations

from pathlib import Path

import torch

# Small but not degenerate: GQA (4 heads, 2 kv heads), explicit head_dim, 3 layers.
BASE = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

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
        return tf.Gemma2Config(
            **kw, attn_logit_softcapping=20.0, final_logit_softcapping=15.0, sliding_window=8, query_pre_attn_scalar=8
        )
    if arch == "gemma3_text":
        return tf.Gemma3TextConfig(**kw, sliding_window=8, query_pre_attn_scalar=8)
    if arch == "gemma3":
        text = tf.Gemma3TextConfig(**kw, sliding_window=8, query_pre_attn_scalar=8)
        vision = dict(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
        )
        return tf.Gemma3Config(
            text_config=text,
            vision_config=vision,
            mm_tokens_per_image=4,
            image_token_index=95,
            boi_token_index=93,
            eoi_token_index=94,
        )
    if arch == "phi3":
        return tf.Phi3Config(**{k: v for k, v in kw.items() if k != "head_dim"})
    if arch == "olmo2":
        return tf.Olmo2Config(**{k: v for k, v in kw.items() if k != "head_dim"})
    if arch == "mixtral":
        return tf.MixtralConfig(**kw, **MOE, num_local_experts=4)
    if arch == "qwen2_moe":
        return tf.Qwen2MoeConfig(
            **kw, **MOE, num_experts=4, moe_intermediate_size=16, shared_expert_intermediate_size=24
        )
    if arch == "qwen3_moe":
        return tf.Qwen3MoeConfig(**kw, **MOE, num_experts=4, moe_intermediate_size=16)
    if arch == "olmoe":
        return tf.OlmoeConfig(**{k: v for k, v in kw.items() if k != "head_dim"}, **MOE, num_experts=4)
    if arch == "gpt_oss":
        return tf.GptOssConfig(**{**MOE, "num_local_experts": 4, "sliding_window": 8, **kw})
    from tests.support.tiny_moe import FAMILIES, OVERRIDES, tiny_moe_config  # issue 24's mixtures of experts

    if arch in FAMILIES or arch in OVERRIDES:
        return tiny_moe_config(arch, **overrides)
    raise KeyError(arch)


def build_tiny(
    arch: str,
    path: Path,
    dtype: torch.dtype = torch.float32,
    shard: str | None = None,
    seed: int = 0,
    fused: bool = False,
    **overrides,
) -> Path:
    """Save a seeded random ``arch`` model at ``path`` (sharded when ``shard`` is e.g. "20KB").

    ``fused``: a mixture of experts is written with its in-memory fused 3-D expert tensors
    (``mlp.experts.gate_up_proj``) instead of save_pretrained's one tensor per expert.
    """
    from transformers import AutoModelForCausalLM

    from tests.support.tiny_moe import RELEASE_CLASSES

    torch.manual_seed(seed)
    config = tiny_config(arch, **overrides)
    if arch in RELEASE_CLASSES:  # a multimodal release: saved with its vision model
        import transformers

        model = getattr(transformers, RELEASE_CLASSES[arch])(config)
    else:
        model = AutoModelForCausalLM.from_config(config)
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
