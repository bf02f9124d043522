"""The vocabulary's table kept in its stored 16 bits while the model computes in float32 (model/upcast.py):
the input embeddings widen only the rows their tokens look up, and the output head computes its logits a
chunk of rows at a time, each chunk widened for its own matmul and dropped after. Neither widens the whole
table, which on a small model is the largest tensor of all (SmolLM2-135M: 108 MB in float32, eight decoder
layers' worth, tied to its head), so the peak stays the checkpoint plus one decoder layer in float32.
Every input embedding of the architecture table's families looks its ids up through nn.Embedding's
forward (a scale or a norm after it, at most), which is what the wrapped lookup assumes.

bf16/f16 → f32 is exact and looking rows up commutes with it, so the embeddings are the whole widened
table's, bit for bit. Each logit is one row's dot product with the hidden state: cutting the rows into
chunks of the same aligned length leaves every dot product to the same kernel (:data:`ALIGN`), and the
logits are the whole matmul's bit for bit (tests/model/test_upcast.py checks it against the whole float32
model).

The modules keep their class and their hooks: only the call of their own forward is wrapped (an instance
attribute), so the hooks of the twins and finders see the token ids and the outputs they saw before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from .rewiden import Rewidening
from .widening import STORED, WIDEN_ATTR

# The head's chunks start at multiples of this many rows and are as long, but the last. MKL computes a
# chunk of up to 11 rows, or, for one or two tokens, one whose length is not a multiple of 4, with
# another kernel, which rounds some logits differently in their last bit (measured here); aligned and at
# least this long, the chunks gave the whole matmul's logits bit for bit in all 616 cases of
# examples/check_head_chunks.py (tables of 1000 to 262144 rows, 32 to 576 wide, 1 to 130 tokens).
ALIGN = 64


def attach_table(model: nn.Module, layer_weights: int) -> set[int]:
    """Make ``model``'s input embeddings and output head (tied or not) widen their 16-bit table a part at a
    time, the head's chunks at most ``layer_weights`` weights (one decoder layer's; :func:`head_spans`
    says when a chunk takes a few rows more); the ids of the modules
    it changed, which the per-module upcast leaves alone. A table held in another form (quantized codes,
    widened by their own function) or a module whose forward is not plain (a head other than nn.Linear,
    an embedding with max_norm, which renormalizes its table in place) is left to the whole upcast."""
    done = set()
    embeddings = model.get_input_embeddings()
    if _plain_table(embeddings, nn.Embedding) and embeddings.max_norm is None:
        embeddings.forward = _gathering(embeddings, embeddings.forward)
        done.add(id(embeddings))
    head = model.get_output_embeddings()
    if _plain_table(head, nn.Linear) and type(head) is nn.Linear:
        head.forward = _chunked(head, head_spans(head.out_features, layer_weights // head.in_features))
        done.add(id(head))
    return done


def head_spans(rows: int, most: int) -> list[slice]:
    """The head's ``rows`` cut into chunks of ``most`` rows rounded down to a multiple of :data:`ALIGN` (at
    least ALIGN), but the last, which ends at ``rows``; a last chunk shorter than ALIGN joins the one before
    it (then up to ALIGN − 1 rows over)."""
    size = max(ALIGN, most // ALIGN * ALIGN)
    starts = list(range(0, rows, size))
    if len(starts) > 1 and rows - starts[-1] < ALIGN:
        starts.pop()
    return [slice(start, end) for start, end in zip(starts, [*starts[1:], rows])]


def _plain_table(module, kind: type) -> bool:
    """Whether ``module`` is a ``kind`` whose 16-bit tensors are its stored table and bias (nothing else to
    widen), with no widening function of its own."""
    if not isinstance(module, kind) or "weight" in getattr(module, WIDEN_ATTR, {}):
        return False
    tensors = {**module._parameters, **module._buffers}
    stored = {name for name, t in tensors.items() if t is not None and t.dtype in STORED}
    return "weight" in stored and stored <= {"weight", "bias"}


def _widened(table: torch.Tensor, rows) -> torch.Tensor:
    """``table[rows]`` in float32, made as model/upcast.py makes its copies: outside inference mode and
    asking for a gradient as the stored table does (torch picks its matmul path, and its rounding, by that)."""
    with torch.inference_mode(False):
        return table.detach()[rows].to(torch.float32).requires_grad_(table.requires_grad)


def _gathering(module: nn.Embedding, forward: Callable) -> Callable:
    """``module``'s forward on the float32 rows of only the ids it is given: the ids are replaced by their
    places among those rows, and the padding row's index follows (or is dropped when no id is padding:
    it only keeps that row's gradient at zero)."""

    def gathered(ids: torch.Tensor, *args, **kwargs):
        table, padding = module._parameters["weight"], module.padding_idx
        if table is None or table.dtype not in STORED:  # already widened by an enclosing upcast
            return forward(ids, *args, **kwargs)
        rows, places = torch.unique(ids, return_inverse=True)
        module._parameters["weight"] = _widened(table, rows)
        if padding is not None:
            found = (rows == padding).nonzero()
            module.padding_idx = int(found[0, 0]) if len(found) else None
        try:
            return forward(places, *args, **kwargs)
        finally:
            module._parameters["weight"], module.padding_idx = table, padding

    return gathered


def _chunked(module: nn.Linear, spans: list[slice]) -> Callable:
    """nn.Linear's forward computed a chunk of output rows (``spans``) at a time, each chunk of its weight
    (and bias) widened to float32 for its matmul only; the logits are written into one output
    (concatenated instead when autograd records the call, which an in-place write would complicate; the
    chunks autograd saves are then widened again by the backward, one at a time: model/rewiden.py)."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        weight, bias = module.weight, module.bias
        if weight.dtype not in STORED:
            return nn.functional.linear(x, weight, bias)

        def part(span: slice) -> torch.Tensor:
            wide_bias = None if bias is None else _widened(bias, span)
            return nn.functional.linear(x, _widened(weight, span), wide_bias)

        def saved_part(span: slice) -> torch.Tensor:
            """:func:`part` whose widened chunk the backward widens again, a chunk at a time (model/rewiden.py)."""
            wide_bias = None if bias is None else _widened(bias, span)
            with Rewidening() as rewidening:
                wide = _widened(weight, span)
                rewidening.add(wide, functools.partial(_widened, weight, span))
                return nn.functional.linear(x, wide, wide_bias)

        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            return torch.cat([saved_part(span) for span in spans], dim=-1)
        out = None
        for span in spans:
            logits = part(span)
            out = logits.new_empty(*logits.shape[:-1], weight.shape[0]) if out is None else out
            out[..., span] = logits
        return out

    return forward
