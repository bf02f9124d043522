"""The residual stream at each prompt's last token, after every decoder layer.

Forward hooks on the decoder layers (where the architecture table says they are) keep, for each
prompt, the layer's output at its last real token — nothing else of the sequence. Padding is on
the right, so real tokens keep their positions and (causal attention) never see a pad token: a
prompt in a batch gives what it gives alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from ...core.errors import SurgeryError
from ...model.hooks import decoder_layers, model_architecture
from ...model.placement import input_device


def last_token_residuals(
    model: nn.Module,
    tokenizer,
    texts: Sequence[str],
    *,
    add_special_tokens: bool = True,
    batch_size: int = 16,
    progress: Callable[[int], None] = lambda n: None,
) -> np.ndarray:
    """[texts, layers, hidden] float32: each text's residual stream at its last token after each layer."""
    layers = decoder_layers(model)
    state: dict = {}
    kept: dict[int, torch.Tensor] = {}

    def hook_for(i: int):
        def hook(module: nn.Module, args: tuple, output) -> None:
            hidden = output[0] if isinstance(output, tuple) else output
            kept[i] = hidden[state["rows"], state["last"].to(hidden.device)].float().cpu()

        return hook

    handles = [layer.register_forward_hook(hook_for(i)) for i, layer in enumerate(layers)]
    device = input_device(model)
    out = np.zeros((len(texts), len(layers), model_architecture(model).geometry.hidden_size), dtype=np.float32)
    try:
        for start in range(0, len(texts), batch_size):
            batch = list(texts[start : start + batch_size])
            enc = tokenizer(
                batch, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=add_special_tokens
            )
            mask = enc["attention_mask"]
            if bool((mask.sum(dim=1) == 0).any()):
                raise SurgeryError("a prompt tokenizes to no tokens; remove empty prompts")
            state["rows"], state["last"] = torch.arange(len(batch)), mask.sum(dim=1) - 1
            kept.clear()
            with torch.inference_mode():
                model(input_ids=enc["input_ids"].to(device), attention_mask=mask.to(device), use_cache=False)
            out[start : start + len(batch)] = torch.stack([kept[i] for i in range(len(layers))], dim=1).numpy()
            progress(len(batch))
    finally:
        for h in handles:
            h.remove()
    return out
