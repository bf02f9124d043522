"""Whether a checkpoint's config describes its weights, checked before transformers loads it."""

from __future__ import annotations

from ..core.architectures import architecture
from ..core.checkpoint import Checkpoint
from ..core.patches import check_attention


def check_loadable(ckpt: Checkpoint) -> None:
    """Before a find command loads the model: a config that does not describe the weights is one
    line naming the field and the tensor, not a size mismatch inside transformers' loader (an int4 /
    int8 checkpoint's packed weights are read at their logical shape)."""
    check_attention(ckpt.format.view(ckpt), architecture(ckpt.config))
