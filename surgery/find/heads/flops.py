"""Forward FLOPs of find-heads' passes, counted from the model's sizes: what a run did (its findings'
``cost``), what a knockout resumed at its heads' layer costs, and the exhaustive procedure as full passes
(the denominator every ratio of find-heads' work is quoted against)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from ...core.mcq import Encoded
from ...model.hooks import decoder_layers, model_architecture
from ...model.widening import weight_count


@dataclass
class Counter:
    """Forward-pass FLOPs, counted per layer as 2·params per token (matmuls) plus 4·q·k·heads·head_dim
    (attention scores and their sum over values), and 2·vocab·hidden for the kept logit position."""

    layer_params: int
    layers: int
    attn_width: int  # heads × head_dim
    head_params: int  # lm_head
    flops: int = 0
    resumable: bool = True  # False: a resumed pass reruns every position (no key/value-only cache)

    @classmethod
    def of(cls, model: nn.Module) -> Counter:
        layers = decoder_layers(model)
        arch = model_architecture(model)
        # heads × head_dim from the table, layer by layer (Gemma 4's full-attention heads are wider; a
        # hybrid's other layers have no softmax attention): the mean over the layers
        widths = [
            arch.at(i).geometry.num_heads * arch.at(i).geometry.head_dim if i in arch.head_layers() else 0
            for i in range(len(layers))
        ]
        return cls(
            weight_count(layers[0]),  # a weight held packed counts as the weights it holds
            len(layers),
            round(sum(widths) / len(widths)),
            model.get_output_embeddings().weight.numel(),
            resumable=arch.kv_cache_only(),
        )

    def layer_flops(self, rows: int, length: int, start: int = 0, first: int = 0, end: int | None = None) -> int:
        """FLOPs of ``rows`` prompts of ``length`` tokens, queries ``start:``, layers ``first:end``."""
        q = length - start
        per_layer = 2 * self.layer_params * q + 4 * q * length * self.attn_width
        return rows * ((self.layers if end is None else end) - first) * per_layer

    def pass_flops(self, rows: int, length: int, start: int = 0, first: int = 0) -> int:
        """FLOPs of a pass from layer ``first`` to the logits of the last position."""
        return self.layer_flops(rows, length, start, first) + rows * 2 * self.head_params

    def add(self, rows: int, length: int, start: int = 0, first: int = 0, end: int | None = None) -> None:
        self.flops += self.layer_flops(rows, length, start, first, end)

    def add_head(self, rows: int) -> None:
        self.flops += rows * 2 * self.head_params

    def _batches(self, prompts: Sequence[Encoded], batch_size: int) -> list[list[Encoded]]:
        """``prompts`` grouped as prompts.batches groups them (sorted by length)."""
        rows = sorted(prompts, key=lambda p: len(p.ids))
        return [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]

    def full(self, prompts: Sequence[Encoded], batch_size: int) -> int:
        """FLOPs of one full pass over ``prompts`` in batches of ``batch_size`` (left-padded)."""
        return sum(self.pass_flops(len(b), max(len(p.ids) for p in b)) for b in self._batches(prompts, batch_size))

    def _screen_start(self, batch: Sequence[Encoded]) -> int:
        """Where the screen's pass with gradients starts in a batch (atp.screen_start): its first
        tested token, padded (0 where a resumed pass reruns every position)."""
        length = max(len(p.ids) for p in batch)
        firsts = [length - len(p.ids) + min(p.spans["tested"]) for p in batch if p.spans.get("tested")]
        return min(firsts) if firsts and self.resumable else 0

    def screen_forward(self, prompts: Sequence[Encoded], batch_size: int) -> int:
        """FLOPs of the screen's forward with gradients over ``prompts`` (atp.resumed_attributions):
        every layer, the positions from each batch's first tested token on."""
        return sum(
            self.pass_flops(len(b), max(len(p.ids) for p in b), self._screen_start(b))
            for b in self._batches(prompts, batch_size)
        )

    def backward(self, prompts: Sequence[Encoded], batch_size: int) -> int:
        """FLOPs of the screen's backward over ``prompts`` (atp.py: input gradients only, from the kept
        logit position, over the positions its forward ran): every layer's linear maps once more (their
        input gradients) and the attention's two products twice (the gradients of both factors), but
        layer 0's products once (only its patterns carry a gradient). Layer 0's query, key and value
        maps are counted though they get no gradient: a bound, above the measured count by less than
        one layer's linear maps."""
        total = 0
        for b in self._batches(prompts, batch_size):
            t = max(len(p.ids) for p in b)
            q = t - self._screen_start(b)
            linear, products = 2 * self.layer_params * q, 4 * q * t * self.attn_width
            total += len(b) * (self.layers * (linear + 2 * products) - 3 * products // 2 + 2 * self.head_params)
        return total

    def shared(self, prompts: Sequence[Encoded], batch_size: int) -> int:
        """FLOPs of one plain pass over ``prompts`` as run_prompts runs it: each batch's common prefix
        once, then every row's tail right-padded behind it (shared_prefix.py)."""
        from ...model.shared_prefix import common_prefix
        from .shared_prefix import token_order_groups

        total = 0
        for group in token_order_groups(prompts, batch_size):
            ids = [prompts[i].ids for i in group]
            shared = common_prefix(ids)
            width = max(len(r) for r in ids) - shared
            kept = len({len(r) - shared for r in ids})  # logits at one position per distinct tail length
            total += (
                self.layer_flops(1, shared)
                + self.layer_flops(len(ids), shared + width, shared)
                + len(ids) * kept * 2 * self.head_params
            )
        return total

    def resumed(self, prompts: Sequence[Encoded], batch_size: int, span: str, layer: int = 0) -> int:
        """FLOPs of one edge edit of heads from ``layer`` on, queries ``span``, as :func:`resume` counts
        it where the edit changes a row of every batch (it stops early otherwise): the first edited
        layer on every position, the layers above from the batch's first ``span`` token, the tail."""
        total = 0
        for b in self._batches(prompts, batch_size):
            length = max(len(p.ids) for p in b)
            firsts = [length - len(p.ids) + min(p.spans[span]) if self.resumable else 0 for p in b if p.spans.get(span)]
            if firsts:  # the first edited layer runs full length (resume's bit-exact check)
                total += self.pass_flops(len(b), length, min(firsts), layer + 1)
                total += self.layer_flops(len(b), length, 0, layer, layer + 1)
        return total

    def resumed_bound(self, prompts: Sequence[Encoded], batch_size: int, span: str) -> int:
        """The most FLOPs one edge edit from ``span`` can cost resumed (heads in layer 0)."""
        return self.resumed(prompts, batch_size, span, 0)
