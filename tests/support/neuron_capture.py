"""The plain-loop reference of the neuron capture, and the prompts and model it is checked on."""

from __future__ import annotations

import torch

from surgery.model.hooks import layer_module, model_architecture
from tests.support.tokenizer import save_char_tokenizer

# Different lengths, so batches are padded; one has a character the tokenizer maps to <unk>.
TEXTS = [
    "The nurse said",
    "A tall visitor asked about the medicine",
    "ok",
    "The old tenant, worried!",
    "Students wrote the exam early",
    "The judge thought that",
]


def load_with_char_tokenizer(path):
    """Save the character tokenizer into the checkpoint at ``path``; (its fp32 model in eval mode, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    save_char_tokenizer(path, bos=True)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def reference_pooled(model, tokenizer, text: str) -> torch.Tensor:
    """Plain loop: one prompt, no padding, full forward; the down_proj input averaged over tokens."""
    arch = model_architecture(model)
    seen = {}
    handles = [
        layer_module(model, arch, layer, arch.layout.mlp.down_proj).register_forward_pre_hook(
            lambda m, args, layer=layer: seen.__setitem__(layer, args[0].reshape(-1, args[0].shape[-1]).mean(0))
        )
        for layer in range(arch.geometry.num_layers)
    ]
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([tokenizer(text)["input_ids"]]))
    finally:
        for h in handles:
            h.remove()
    return torch.stack([seen[layer] for layer in sorted(seen)])
