"""Tiny random models of the dense families of issue 24, built from their config classes (no network).

Sizes are set through each family's own config keys, as the architecture table spells them
(``ConfigKeys``: GPT-2's n_layer / n_head / n_embd …). The transformers names a family does not use
(``intermediate_size``, ``num_key_value_heads``, ``head_dim``) are passed too, with values the family
would not compute itself: a table row that read such a stray key would describe other shapes than
the model has, and the bake's shape check would say so. Where the MLP width is a ratio of the
hidden size (GPT-2's null n_inner), the width key is left out so that the ratio is what is tested.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from surgery.core.architectures import ARCHITECTURES

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, WIDTH, LAYERS, VOCAB = 32, 4, 2, 16, 48, 2, 96

# Per case: (model_type, the config's own settings). A case id names a variant of a family.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    **{
        t: (t, {})
        for t in (
            "cohere",
            "cohere2",
            "cwm",
            "doge",
            "ernie4_5",
            "exaone",
            "exaone4",
            "granite",
            "granite_swa",
            "hunyuan_v1_dense",
            "hyperclovax",
            "internlm3",
            "iquestcoder",
            "ministral",
            "ministral3",
            "olmo",
            "olmo3",
            "seed_oss",
            "smollm3",
            "vaultgemma",
            "diffllama",
            "glm",
            "glm4",
            "apertus",
            "apertus1p5_text",
            "arcee",
            "jais2",
            "nanochat",
            "nemotron",
            "starcoder2",
            "phi",
            "gpt_neox",
            "opt",
            "biogpt",
            "xglm",
            "bloom",
            "mpt",
            "ctrl",
            "gpt2",
            "openai-gpt",
            "gpt_bigcode",
        )
    },
    # transformers' Helium and BitNet size o_proj (BitNet: its sub-norm) by hidden_size: head_dim must
    # be hidden / heads, as in their releases
    "helium": ("helium", {"head_dim": HIDDEN // HEADS}),
    "bitnet": ("bitnet", {"head_dim": HIDDEN // HEADS}),
    # Their rotary embedding reads a head_dim key that their attention ignores: no stray one
    **{t: (t, {"head_dim": None}) for t in ("stablelm", "persimmon", "gpt_neox_japanese", "modernbert-decoder")},
    **{t: (t, {"head_dim": None, "rotary_dim": 4}) for t in ("gptj", "codegen")},  # rotary_dim ≤ head_dim
    "cpmant": ("cpmant", {"init_std": 0.02}),  # its default 1.0 makes logits of ~10: fp32 rounding above 1e-5
    "gpt_neo": ("gpt_neo", {"attention_types": [[["global", "local"], 1]], "window_size": 4}),
    # Doge's cross-domain MoE keeps a dense gated MLP next to its expert embeddings: its neurons are edited
    "doge-cdmoe": ("doge", {"is_moe": True, "num_experts": 16, "num_experts_per_tok": 2}),
    "falcon": ("falcon", {}),  # multi_query: one k/v head
    "falcon-mha": ("falcon", {"multi_query": False}),
    "falcon-new": ("falcon", {"new_decoder_architecture": True, "num_kv_heads": KV_HEADS}),
    "gpt_bigcode-mha": ("gpt_bigcode", {"multi_query": False}),
    "cohere-biased": ("cohere", {"attention_bias": True}),
    "olmo-clip": ("olmo", {"clip_qkv": 0.5}),
}
# Sizes every config is given, whatever its family's keys (harmless where unused).
COMMON = dict(
    vocab_size=VOCAB,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
# The transformers names of the sizes and the values they get when the family's key has that name.
STANDARD = dict(
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    hidden_size=HIDDEN,
    intermediate_size=WIDTH,
    num_key_value_heads=KV_HEADS,
    head_dim=HEAD_DIM,
)
# The values a stray key gets where the family spells the size otherwise: never what the family computes.
STRAY = dict(intermediate_size=WIDTH + 8, num_key_value_heads=1, head_dim=2 * HEAD_DIM)


def family_config(case: str, **overrides: Any):
    """The config object of ``case`` (a key of CASES), tiny, through the family's own keys."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type, own = CASES[case]
    cls, keys = CONFIG_MAPPING[model_type], ARCHITECTURES[model_type].config.keys
    kwargs: dict[str, Any] = dict(COMMON)
    for name, value in STANDARD.items():
        key = getattr(keys, name)
        if key != name and name in STRAY and not isinstance(getattr(cls, name, None), property):
            kwargs[name] = STRAY[name]  # a transformers name this family must not read (Falcon computes head_dim)
        if key is not None and not (name == "intermediate_size" and keys.mlp_ratio is not None):
            kwargs[key] = value
    return cls(**{**kwargs, **own, **overrides})


def build_family(case: str, path: Path, seed: int = 0, **overrides: Any) -> Path:
    """Save a seeded random fp32 model of ``case`` at ``path`` (every weight perturbed, so none is
    a trivial 0 or 1) with save_pretrained, i.e. under the names the family stores on disk.
    ``overrides``: config settings (``vocab_size=128`` for the character tokenizer …)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(case, **overrides))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(path)
    return path
