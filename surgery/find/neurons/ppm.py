"""PPM (parameter magnitude) of every MLP neuron: max + |min| of each of its input rows, summed.

One of fairness pruning's two scores (scores.py combines them): a neuron with large input weights
matters more to the model, so the FairnessPruningScore prefers pruning small ones. The rows a
neuron owns come from the architecture table, as the bake's do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where the model runs
    import torch
    from torch import nn


def ppm_scores(model: nn.Module) -> np.ndarray:
    """PPM of every neuron, [layers, width]: max + |min| of each of its MLP input rows, summed —
    gate and up (Phi-3: both halves of the fused gate_up), or up alone in an ungated MLP. The rows
    come from the architecture table (``mlp_input_modules``, ``neuron_rows``), as the bake's."""
    from ...model.hooks import model_architecture

    arch = model_architecture(model)
    g = arch.geometry
    if g.sparse_layers:
        return _expert_ppm(model, arch)
    rows = _neuron_rows(arch)
    return np.stack([_dense_ppm(model, arch, layer, rows) for layer in range(g.num_layers)])


def _param(module: nn.Module, name: str = "weight") -> torch.Tensor:
    """A module's parameter in float32, also when accelerate offloads it to disk (it is on "meta"
    until brought in; the tensor read stays valid after it is sent back)."""
    from accelerate.utils import align_module_device

    from ...model.upcast import computed_value

    with align_module_device(module):
        return computed_value(module, name)  # FP8 values held in 16 bits: times their scales


def _ppm(*inputs: torch.Tensor) -> np.ndarray:
    """max + |min| of each neuron's row of every MLP input matrix (gate, up), summed."""
    return sum(w.amax(-1) + w.amin(-1).abs() for w in inputs).double().cpu().numpy()


def _neuron_rows(arch) -> dict[str, np.ndarray]:
    """Per MLP input matrix, [width, rows per neuron]: the rows each dense neuron owns (the same in
    every layer, so found once, not once per layer)."""
    width = arch.geometry.intermediate_size
    return {m: np.array([arch.neuron_rows(m, i) for i in range(width)]) for m in arch.mlp_input_modules()}


def _dense_ppm(model: nn.Module, arch, layer: int, rows: dict[str, np.ndarray]) -> np.ndarray:
    """PPM of a dense MLP layer's neurons: max + |min| of each neuron's rows of its input matrices
    (gate and up, or both halves of a fused gate_up; up alone in an ungated MLP), summed;
    ``rows``: :func:`_neuron_rows`."""
    from ...model.hooks import layer_module

    out = np.zeros(arch.geometry.intermediate_size, dtype=np.float64)
    for module, idx in rows.items():
        w = _param(layer_module(model, arch, layer, module))
        w = w.T if arch.stored_flipped(module) else w  # a Conv1D holds [in, out]: a neuron is a column
        out += (w.amax(1) + w.amin(1).abs()).double().cpu().numpy()[idx].sum(axis=1)
    return out


def _expert_ppm(model: nn.Module, arch) -> np.ndarray:
    """PPM of every expert neuron, [layers, E·I + shared], read from the fused in-memory experts;
    a dense layer's neurons in its first columns (no neuron past them: NaN)."""
    from ...model.hooks import layer_module
    from .experts import columns

    g, ex = arch.geometry, arch.layout.experts
    out = np.full((g.num_layers, columns(arch)), np.nan, dtype=np.float64)
    rows = None
    for layer in range(g.num_layers):
        if not arch.is_sparse(layer):
            rows = _neuron_rows(arch) if rows is None else rows
            out[layer, : g.intermediate_size] = _dense_ppm(model, arch, layer, rows)
            continue
        w = _param(layer_module(model, arch, layer, ex.weights.module), "gate_up_proj")
        w = w.transpose(1, 2) if ex.weights.transposed else w  # [E, 2I, H]
        if not ex.weights.interleaved:
            gate, up = w[:, : g.expert_size], w[:, g.expert_size :]
        else:  # GPT-OSS: gate/up interleaved
            gate, up = w[:, 0::2], w[:, 1::2]
        row = [_ppm(gate, up).reshape(-1)]
        if ex.shared and g.shared_size:
            inputs = [_param(layer_module(model, arch, layer, f"{ex.shared.module}.{m}")) for m in ex.shared.inputs]
            if ex.shared.fused:  # one [gate; up] matrix: its two halves
                inputs = [half for w in inputs for half in (w[: g.shared_size], w[g.shared_size :])]
            row.append(_ppm(*inputs))
        row = np.concatenate(row)
        out[layer, : len(row)] = row
    return out
