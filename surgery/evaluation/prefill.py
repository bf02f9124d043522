"""Greedy answers under a run-time edit that reuse the unedited prefill below the edit's lowest layer.

An edit whose sites all sit in decoder layers L… changes nothing that layers 0…L-1 compute over the
prompt: their outputs and the keys/values they leave in the cache are those of the unedited run of
the same batch. So the unedited generation records, for each batch, what every decoder layer
returned in the prefill (its first call) and the cache layer it filled; an edited generation of the
same batch replays those for the layers below L (each returns its recorded output and puts its
recorded cache layer back) and computes the rest as ``model.generate`` does. The answers are those
of a full generation, bit for bit: the layers that run get the same inputs, and the decode steps
run every layer.

Only plain key/value caches are replayed (transformers' ``DynamicLayer``, which a later step extends
by concatenation, never in place); a batch whose cache is any other kind is generated in full.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..core.sites import all_sites
from ..model.hooks import decoder_layers, model_architecture


def lowest_layer(model: nn.Module, edits: Iterable[Any]) -> int:
    """The lowest decoder layer any site of ``edits`` sits in (0 when one sits next to the layer list,
    the embeddings; the layer count when there is none)."""
    layers = [site.layer for site in all_sites(model_architecture(model), edits)]
    if any(layer is None for layer in layers):
        return 0
    return min(layers, default=len(decoder_layers(model)))


@dataclass
class _Recorded:
    """One batch's unedited prefill: per decoder layer, what it returned and its cache layer after."""

    outputs: list[Any]
    caches: list[Any]


def _cache_of(kwargs: dict[str, Any]) -> Any:
    """The cache a decoder layer call got (``cache``; older transformers: ``past_key_values``)."""
    return kwargs.get("cache", kwargs.get("past_key_values"))


class Prefills:
    """The unedited prefills of the batches a model answers, keyed by the batch's pass (its formatted
    texts; their shared prefix's pass: ("prefix", texts), model.shared_prefix)."""

    def __init__(self) -> None:
        self.batches: dict[Hashable, _Recorded | None] = {}  # None: not replayable

    @contextmanager
    def recording(self, model: nn.Module, texts: Hashable) -> Iterator[None]:
        """Record what the unedited generation (or pass) of ``texts`` inside this context computes in its
        prefill."""
        from transformers.cache_utils import DynamicLayer

        layers = decoder_layers(model)
        outputs: list[Any] = [None] * len(layers)
        caches: list[Any] = [None] * len(layers)
        calls = [0] * len(layers)

        def hook(i: int):
            def after(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
                calls[i] += 1
                if calls[i] == 1:  # the prefill; later calls are the decode steps
                    cache = _cache_of(kwargs)
                    layer = cache.layers[i] if cache is not None and len(cache.layers) > i else None
                    outputs[i] = _fresh(output)  # the next layer may write into its input
                    # a shallow copy: a later step replaces the layer's tensors, never writes into them
                    caches[i] = copy.copy(layer) if type(layer) is DynamicLayer else None

            return after

        handles = [layer.register_forward_hook(hook(i), with_kwargs=True) for i, layer in enumerate(layers)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
        whole = all(c is not None for c in caches) and all(o is not None for o in outputs)
        self.batches[texts] = _Recorded(outputs, caches) if whole else None

    @contextmanager
    def replaying(self, model: nn.Module, texts: Hashable, below: int, tiles: int = 1) -> Iterator[None]:
        """Inside this context the generation of ``texts`` takes layers 0…``below``-1's prefill from
        the recorded unedited one (when there is one); their decode steps run as always. ``tiles``:
        the batch is the recorded one stacked that many times (several trials' rows, find.tune.trial_batch)."""
        recorded = self.batches.get(texts)
        if recorded is not None and tiles > 1:
            recorded = _tiled(recorded, tiles, below)
        if recorded is None or below <= 0:
            yield
            return
        layers = decoder_layers(model)[:below]
        own = [layer.__dict__.get("forward") for layer in layers]  # a forward set on the instance (accelerate)

        def restore(i: int) -> None:
            if own[i] is None:
                layers[i].__dict__.pop("forward", None)
            else:
                layers[i].forward = own[i]

        def replay(i: int):
            def forward(*args: Any, **kwargs: Any) -> Any:
                restore(i)  # the decode steps run the layer itself
                cache = _cache_of(kwargs)
                if not _takes(cache, i, recorded.caches[i]):  # a cache this cannot fill: the layer computes
                    return layers[i].forward(*args, **kwargs)
                cache.layers[i] = copy.copy(recorded.caches[i])
                return _fresh(recorded.outputs[i])

            return forward

        try:
            for i, layer in enumerate(layers):
                layer.forward = replay(i)
            yield
        finally:
            for i in range(len(layers)):
                restore(i)


def _tiled(recorded: _Recorded, tiles: int, below: int) -> _Recorded:
    """``recorded``'s layers below ``below`` (those replayed) as the pass of its batch stacked ``tiles``
    times (rows: the batch, then the batch again, …)."""

    def stack(t: Any) -> Any:
        return t.repeat(tiles, *([1] * (t.dim() - 1))) if hasattr(t, "repeat") else t

    caches = []
    for layer in recorded.caches[:below]:
        layer = copy.copy(layer)
        layer.keys, layer.values = stack(layer.keys), stack(layer.values)
        caches.append(layer)
    outputs = [tuple(stack(t) for t in o) if isinstance(o, tuple) else stack(o) for o in recorded.outputs[:below]]
    return _Recorded(outputs, caches)


def _takes(cache: Any, i: int, layer: Any) -> bool:
    """Whether layer ``i`` of ``cache`` may be set to the recorded cache layer ``layer``: a cache held
    where it is computed (not offloaded), with a slot for layer ``i`` of the recorded kind, empty or
    holding only a shared prefix (fewer positions than the recorded layer, which begins with them)."""
    if cache is None or getattr(cache, "offloading", False) or not hasattr(cache, "layers"):
        return False
    make = getattr(cache, "layer_class_to_replicate", None)
    while make is not None and len(cache.layers) <= i:  # a cache made without a config grows its layers
        cache.layers.append(make())
    if len(cache.layers) <= i or type(cache.layers[i]) is not type(layer):
        return False
    mine = cache.layers[i]
    return not mine.is_initialized or mine.get_seq_length() < layer.get_seq_length()


def _fresh(output: Any) -> Any:
    """A recorded layer output as new tensors (the model may write into what a layer returns)."""
    if isinstance(output, tuple):
        return tuple(t.clone() if hasattr(t, "clone") else t for t in output)
    return output.clone()
