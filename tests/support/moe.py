"""Checkpoints of mixtures of experts in the fused on-disk layout, for tests.

transformers 5 save_pretrained writes one tensor per expert; some releases (GPT-OSS, re-saved
transformers 5 checkpoints elsewhere) store the in-memory fused 3-D tensors instead. We write that
layout ourselves: the model's own state dict, names and all, with safetensors.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn


def resave_fused(model: nn.Module, path: Path) -> None:
    """Replace the weights at ``path`` by ``model``'s state dict as one safetensors file."""
    from safetensors.torch import save_file

    for old in list(path.glob("model*.safetensors")) + list(path.glob("model.safetensors.index.json")):
        old.unlink()
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
