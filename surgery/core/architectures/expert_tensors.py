"""Where a mixture of experts' matrices lie: in a checkpoint (one tensor per expert, or fused 3-D
tensors under transformers' names or a release's own) and in the loaded model, which fuses them.

:class:`ExpertTensors` is a mixin of :class:`~.architecture.Architecture`: its methods read the row's
``Experts`` (``layout.experts``) and the config's sizes (``geometry``), and place names with the
architecture's ``layer_prefix`` and ``module_name``.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import CheckpointError, UnsupportedArchitecture
from .geometry import Geometry
from .layout import TABLE_LOCATION, Layout


class ExpertTensors:
    """The expert slicing of an :class:`~.architecture.Architecture`: its base class, never used
    alone (it names tensors with the architecture's ``layer_prefix`` and ``module_name``)."""

    # Architecture's fields
    model_type: str
    layout: Layout
    geometry: Geometry

    def fused_experts(self, names: Iterable[str]) -> bool:
        """Whether ``names`` (a checkpoint's tensors) hold the experts fused (3-D) or one per expert."""
        return self.stored_experts(names) is not None

    def stored_experts(self, names: Iterable[str]) -> tuple[str, str] | None:
        """The fused (gate_up, down) tensors of ``names`` (a checkpoint's tensors) relative to a
        layer, under the in-memory names or a release's own (``ExpertWeights.stored_fused``); None when
        the checkpoint holds one tensor per expert.

        Decided from the names of the first sparse layer; quantized experts (GPT-OSS's MXFP4
        ``_blocks``/``_scales``) and anything else are one clear line.
        """
        ex = self.layout.experts.weights
        names = set(names)
        layer = min(self.geometry.sparse_layers)
        prefix = self.module_name(self.layer_prefix(names), layer, "")
        in_memory = (f"{ex.module}.gate_up_proj", f"{ex.module}.down_proj")
        if f"{prefix}{in_memory[0]}_blocks" in names:
            raise CheckpointError(
                f"{self.model_type}: the experts are quantized ('{prefix}{in_memory[0]}_blocks', "
                "MXFP4); surgery edits F32, F16 and BF16 weights only: use a dequantized (bf16) copy"
            )
        for fused in filter(None, (in_memory, ex.stored_fused)):
            if f"{prefix}{fused[0]}" in names:
                return fused
        if ex.per_expert and f"{prefix}{ex.per_expert[0].format(expert=0)}.weight" in names:
            return None
        spelled = [f"{prefix}{fused[0]}" for fused in filter(None, (in_memory, ex.stored_fused))]
        spelled += [f"{prefix}{ex.per_expert[0].format(expert=0)}.weight"] if ex.per_expert else []
        raise UnsupportedArchitecture(
            f"{self.model_type}: layer {layer} has no expert tensors (looked for "
            f"{' or '.join(spelled)}); extend {TABLE_LOCATION}"
        )

    def expert_slices(
        self, expert: int, part: str, fused: bool, stored: tuple[str, str] | None = None
    ) -> list[tuple[str, tuple[int, ...], int, int, bool]]:
        """Where a per-expert matrix ``part`` ("gate", "up", "down"; standard [out, in] orientation)
        of ``expert`` lies on disk, as (tensor relative to the layer, its full shape, first row and
        number of rows of the expert's window in the tensor viewed as 2-D [rows, last dim], and
        ``flipped``: the matrix's rows are the window's columns and vice versa). A fused gate/up
        window holds both halves: :meth:`expert_rows` says which of its rows (columns) are a neuron's.
        ``stored``: the fused tensors' names (:meth:`stored_experts`; default the in-memory ones).
        """
        ex, g = self.layout.experts.weights, self.geometry
        E, H, I = g.num_experts, g.hidden_size, g.expert_size
        if not fused:
            name = ex.per_expert[("gate", "up", "down").index(part)].format(expert=expert) + ".weight"
            shape = (H, I) if part == "down" else (I, H)
            return [(name, shape, 0, shape[0], False)]
        gate_up, down = stored or (f"{ex.module}.gate_up_proj", f"{ex.module}.down_proj")
        if part == "down":
            shape = (E, I, H) if ex.transposed else (E, H, I)
            return [(down, shape, expert * shape[1], shape[1], ex.transposed)]
        shape = (E, H, 2 * I) if ex.transposed else (E, 2 * I, H)
        out = [(gate_up, shape, expert * shape[1], shape[1], ex.transposed)]
        if ex.interleaved:  # GPT-OSS: the gate/up bias [E, 2I] is pruned with the rows
            out.append((f"{gate_up}_bias", (E, 2 * I), expert, 1, True))
        return out

    def fused_homes(
        self, stored: Iterable[str], loaded: Iterable[str]
    ) -> dict[str, tuple[str, int, tuple[int, ...], bool]]:
        """Where each per-expert matrix of a checkpoint (tensor names ``stored``) lives in the loaded
        model (parameter names ``loaded``), which fuses a layer's experts: stored name → (fused
        parameter, expert, the rows of the expert's slice in [out, in] orientation that hold the
        matrix, ``flipped``: the slice is stored [in, out]). Empty for a checkpoint of fused experts
        or a model without experts."""
        ex = self.layout.experts
        stored, loaded = list(stored), list(loaded)
        if ex is None or not ex.weights.per_expert or not self.geometry.sparse_layers or self.fused_experts(stored):
            return {}
        s_prefix, l_prefix = self.layer_prefix(stored), self.layer_prefix(loaded)
        I = self.geometry.expert_size
        homes = {}
        for layer in sorted(self.geometry.sparse_layers):
            for e in range(self.geometry.num_experts):
                for part, pattern in zip(("gate", "up", "down"), ex.weights.per_expert):
                    tensor, _, _, _, flipped = self.expert_slices(e, part, fused=True)[0]
                    neurons = range(I) if part != "down" else ()  # down: the whole [H, I] slice
                    rows = tuple(r for n in neurons for r in self.expert_rows(part, n, fused=True))
                    rows = rows or tuple(range(self.geometry.hidden_size))
                    name = self.module_name(s_prefix, layer, pattern.format(expert=e)) + ".weight"
                    homes[name] = (self.module_name(l_prefix, layer, tensor), e, rows, flipped)
        return homes

    def expert_rows(self, part: str, neuron: int, fused: bool) -> tuple[int, ...]:
        """The rows (of a gate/up matrix in [out, in] orientation) that belong to ``neuron``."""
        if not fused or part == "down":
            return (neuron,)
        ex, I = self.layout.experts.weights, self.geometry.expert_size
        if ex.interleaved:
            return (2 * neuron + (part == "up"),)
        return (neuron + (I if part == "up" else 0),)

    def shared_rows(self, neuron: int) -> tuple[int, ...]:
        """Rows of each shared-expert input matrix that belong to ``neuron`` (a fused [gate; up]
        input holds two: ``SharedExpert.fused``)."""
        return (neuron, self.geometry.shared_size + neuron) if self._shared_fused() else (neuron,)

    def shared_input_shape(self) -> tuple[int, int]:
        """The weight shape of each shared-expert input matrix: (S, H), or (2S, H) fused."""
        g = self.geometry
        return ((2 if self._shared_fused() else 1) * g.shared_size, g.hidden_size)

    def _shared_fused(self) -> bool:
        """Whether the shared expert's input is one fused [gate; up] matrix (no shared expert: no)."""
        shared = self.layout.experts.shared if self.layout.experts else None
        return shared is not None and shared.fused
