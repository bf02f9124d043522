"""Direction findings computed once: two prompt sets → last-token residuals → per-layer directions.

For each decoder layer L the direction is the difference of the two sets' mean residuals (after
layer L, at each prompt's last token; float64 means, stored float32), optionally with its
component along the b mean removed ("projected"). The findings JSON records per layer the norms,
how well the unit direction separates the two sets (Cohen's d of the projections, and the accuracy
of the midpoint threshold), the cosine between every two layers' directions, and the layer that
separates best; the vectors go to a safetensors file next to it (``layer.L``, ``mean_a.L``,
``mean_b.L``), which recipes name as ``FILE#layer.L``. Cached by the model key (weights, tokenizer
files, chat template), the two sets' sha256 and the parameters, like the other findings.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ... import __version__
from ...core import distributed
from ...core.architectures import architecture
from ...core.cache import cache_path
from ...core.checkpoint import Checkpoint, file_sha256
from ...core.errors import FindingsError, ParameterError
from ...core.progress import Progress, silent
from ...core.prompts import PromptSet, formatted
from ...model.loadable import check_loadable
from ...model.loading import DEFAULT_LOAD, LoadSpec, load_model, load_tokenizer
from ..findings import Found, compute_record, dtype_key, new_findings
from ..neurons.find import write_findings
from .capture import last_token_residuals
from .record import DirectionsFindings, LayerDirection, VectorsFile

METHOD = {"method": 1, "site": "decoder layer output at the last prompt token", "means": "float64"}


@dataclass
class DirectionFindings(Found):
    """Direction findings (see :class:`surgery.find.findings.Found`) and their vectors file."""

    data: DirectionsFindings
    kind: ClassVar[str] = "directions"
    record_type: ClassVar[type[DirectionsFindings]] = DirectionsFindings

    @property
    def vectors(self) -> Path:
        """The safetensors file of the directions (``layer.L``), next to the findings."""
        if self.data.vectors is None:
            raise FindingsError(f"{self.path} names no vectors file; recompute it with surgery find-direction")
        return self.path.parent / self.data.vectors.file

    @property
    def layers(self) -> list[LayerDirection]:
        return self.data.layers

    def check(self) -> None:
        """The vectors file is there and is the one the findings were written with."""
        path = self.vectors
        if not path.is_file():
            raise FindingsError(
                f"{self.path} names the vectors file {path.name}, which is not next to it; keep the "
                "two files together, or recompute them with surgery find-direction"
            )
        if file_sha256(path) != self.data.vectors.sha256:
            raise FindingsError(
                f"{path} changed since {self.path.name} was written (its sha256 differs); recompute "
                "them with surgery find-direction"
            )

    def record(self) -> dict[str, Any]:
        data = self.data
        return {
            **super().record(),
            "vectors": data.vectors.to_dict() if data.vectors else None,
            "model": data.model.path,
            "model_fingerprint": data.model.fingerprint,
            "dataset": data.dataset.to_dict() if data.dataset else None,
            "parameters": data.parameters,
            "best_layer": data.best_layer,
        }


def vectors_path(findings: Path) -> Path:
    """The vectors file that goes with a findings JSON."""
    return findings.with_suffix(".safetensors")


def write(
    findings: DirectionsFindings, vectors: dict[str, np.ndarray], path: Path, *, main: bool = True
) -> DirectionsFindings:
    """``findings`` naming the vectors file that goes with ``path`` (and its sha256); on the ``main``
    rank, the vectors file and then the findings JSON are written there, both atomically."""
    from safetensors.numpy import save

    from ...core.staging import atomic_write_bytes

    target, data = vectors_path(path), save(vectors)
    findings = replace(findings, vectors=VectorsFile(file=target.name, sha256=hashlib.sha256(data).hexdigest()))
    if main:
        atomic_write_bytes(target, data)
        write_findings(findings, path)
    return findings


def _separation(xa: np.ndarray, xb: np.ndarray, r: np.ndarray) -> tuple[float, float]:
    """(Cohen's d, midpoint accuracy) of the projections of the two sets on the unit vector ``r``."""
    pa, pb = xa.astype(np.float64) @ r, xb.astype(np.float64) @ r
    pooled = np.sqrt((pa.var() + pb.var()) / 2)
    d = float((pa.mean() - pb.mean()) / pooled) if pooled > 0 else float("inf")
    mid = (pa.mean() + pb.mean()) / 2
    accuracy = float(((pa > mid).sum() + (pb <= mid).sum()) / (len(pa) + len(pb)))
    return d, accuracy


def directions(xa: np.ndarray, xb: np.ndarray, projected: bool) -> tuple[dict[str, np.ndarray], list[dict], list]:
    """Per-layer directions from the residuals of the two sets ([prompts, layers, hidden] each):
    the vectors, one row of statistics per layer, and the cosine matrix."""
    mean_a, mean_b = xa.mean(axis=0, dtype=np.float64), xb.mean(axis=0, dtype=np.float64)
    diff = mean_a - mean_b
    if projected:  # remove the part of the difference along the b mean
        unit_b = mean_b / np.linalg.norm(mean_b, axis=1, keepdims=True)
        diff = diff - (diff * unit_b).sum(axis=1, keepdims=True) * unit_b
    norms = np.linalg.norm(diff, axis=1)
    units = diff / np.where(norms > 0, norms, 1.0)[:, None]
    rows = []
    for layer in range(diff.shape[0]):
        d, accuracy = _separation(xa[:, layer], xb[:, layer], units[layer])
        rows.append(
            {
                "layer": layer,
                "norm": float(norms[layer]),
                "norm_a": float(np.linalg.norm(mean_a[layer])),
                "norm_b": float(np.linalg.norm(mean_b[layer])),
                "separation": d,
                "accuracy": accuracy,
            }
        )
    cosine = np.round(units @ units.T, 4).tolist()
    vectors = {
        f"{kind}.{layer}": v[layer].astype(np.float32)
        for layer in range(diff.shape[0])
        for kind, v in (("layer", diff), ("mean_a", mean_a), ("mean_b", mean_b))
    }
    return vectors, rows, cosine


def params_of(projected: bool, template: str, load: LoadSpec) -> dict[str, Any]:
    """What is computed, and how (the cache key's parameters)."""
    return {**METHOD, "projected": projected, "template": template, **dtype_key(load)}


def dataset_sha256(a: PromptSet, b: PromptSet) -> str:
    return hashlib.sha256(f"{a.sha256}:{b.sha256}".encode()).hexdigest()


def cached_path(ckpt: Checkpoint, a: PromptSet, b: PromptSet, params: dict[str, Any]) -> Path:
    return cache_path("directions", ckpt.model_key(), dataset_sha256(a, b), params)


def find_direction(
    ckpt: Checkpoint,
    a: PromptSet,
    b: PromptSet,
    *,
    projected: bool = False,
    template: str = "auto",
    batch_size: int = 16,
    load: LoadSpec = DEFAULT_LOAD,
    recompute: bool = False,
    progress: Progress = silent,
    report: Callable[[str], None] = lambda m: None,
) -> DirectionFindings:
    """Cached direction findings for (model, a, b, parameters), computed on a miss."""
    architecture(ckpt.config).check_findable(
        "find-direction", "project a direction of your own by name instead (a recipe's direction edit with its vector)"
    )
    if a.sha256 == b.sha256:
        raise ParameterError(
            "{a} and {b} hold the same prompts: their difference is no direction; give two sets "
            "that differ in the behaviour",
            "a",
            "b",
        )
    params = params_of(projected, template, load)
    distributed.check_agree("the model and the prompt sets", ckpt.model_key(), a.sha256, b.sha256, params, batch_size)
    cached = cached_path(ckpt, a, b, params)
    hit = None if recompute else DirectionFindings.cached(cached, ckpt)
    if distributed.all_true(hit is not None):
        return hit

    check_loadable(ckpt)
    tokenizer = load_tokenizer(ckpt.path, load)
    texts_a, special = formatted(tokenizer, a.prompts, template)
    texts_b, _ = formatted(tokenizer, b.prompts, template)
    model = load_model(ckpt.path, load)
    texts = texts_a + texts_b
    advance = progress("capturing prompts", len(texts))
    # Under torchrun each rank runs whole batches of its own; the rows are then gathered in order.
    # Memory: prompts × layers × hidden float32 (the separation needs every prompt's projection).
    work = distributed.Shard(range(len(texts)), chunk=batch_size)
    g = architecture(ckpt.config).geometry
    residuals = np.zeros((len(texts), g.num_layers, g.hidden_size), dtype=np.float32)
    residuals[work.mine] = last_token_residuals(
        model,
        tokenizer,
        [texts[i] for i in work.mine],
        add_special_tokens=special,
        batch_size=batch_size,
        progress=advance,
    )
    (residuals,) = work.gather(residuals)
    work.finish(advance)
    compute = compute_record(model)
    del model

    vectors, rows, cosine = directions(residuals[: len(texts_a)], residuals[len(texts_a) :], projected)
    findings = new_findings("directions", ckpt, dataset_sha256(a, b), params, __version__)
    findings["compute"] = compute
    findings["dataset"] = {"a": a.record(), "b": b.record(), "chat_template": not special}
    findings["best_layer"] = max(rows, key=lambda r: r["separation"])["layer"]
    findings["layers"] = rows
    findings["cosine"] = cosine
    # every rank names the vectors file; rank 0 writes
    record = write(DirectionsFindings.from_dict(findings), vectors, cached, main=distributed.is_main())
    return DirectionFindings(record, cached, from_cache=False)
