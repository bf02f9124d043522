"""What a model computing in float32 from stored 16-bit tensors marks on its modules, shared by the upcast
(model/upcast.py), the held quantized weights (model/dequantized.py) and the vocabulary's table
(model/vocab_table.py): which dtypes widen exactly, and how a tensor that is not yet its weights widens."""

from __future__ import annotations

import torch

STORED = (torch.bfloat16, torch.float16)  # the dtypes whose upcast to float32 is exact
# A module attribute: tensor name → how its float32 value is made from the stored one, for tensors
# whose stored values are not yet the weights (FP8 values held in 16 bits, times their scales:
# model/dequantized.py); every other 16-bit tensor is upcast as is.
WIDEN_ATTR = "_surgery_widen"


def weight_count(module) -> int:
    """The number of weights in ``module``'s parameters (its subtree's): a weight held as packed bytes
    (model/dequantized.py's ``hold_packed``) counts as the weights it holds, not as its bytes."""
    total = 0
    for owner in module.modules():
        widen = getattr(owner, WIDEN_ATTR, {})
        for leaf, p in owner._parameters.items():
            if p is not None:
                total += getattr(widen.get(leaf), "numel", p.numel())
    return total
