"""A GGUF file as surgery edits it: its header (tensor places), its transformers config, the
architecture row of surgery's table, and the map from transformers tensor names to GGUF ones.

The config is the one transformers derives from the GGUF metadata (``AutoConfig`` with
``gguf_file``): that is transformers' own GGUF-architecture → model_type mapping, and the model
type must then have a row in ``surgery/core/architectures.py``. Tensor names go through gguf-py's
``TensorNameMap`` (llama.cpp's own table), never a second hand-made copy.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ..core.architectures import Architecture, architecture
from ..core.cache import cache_dir
from ..core.errors import CheckpointError, RecipeError
from ..core.optional import require
from ..core.staging import atomic_write_text
from ..core.strict_files import load_json
from .header import GgufHeader, GgufTensor, check_complete, read_gguf_header
from .importing import check_supported


def _header_digest(path: Path, header: GgufHeader) -> str:
    """sha256 of the bytes before the first tensor: metadata and tensor table (what the config is read from)."""
    start = min((t.offset for t in header.tensors.values()), default=path.stat().st_size)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(start))
    return h.hexdigest()


def _config_file(path: Path, header: GgufHeader) -> Path:
    return cache_dir() / "gguf-configs" / f"{_header_digest(path, header)}.json"


def remember_config(path: Path, config: dict[str, Any]) -> None:
    """Cache ``config``, the transformers config of the GGUF at ``path`` as another step read it (an
    import reads it too), so a bake of the file does not read the whole vocabulary again."""
    atomic_write_text(_config_file(path, read_gguf_header(path)), json.dumps(config, sort_keys=True))


def _config(path: Path, header: GgufHeader) -> dict[str, Any]:
    """The transformers config of the GGUF, cached by the header's sha256 (transformers reads the
    whole vocabulary to build it: seconds on a 49k vocabulary, ~40 s on a 262k one; importing it
    alone takes seconds)."""
    cached = _config_file(path, header)
    if cached.is_file():
        return load_json(cached.read_text(encoding="utf-8"))
    check_supported(header)  # an architecture transformers reads the config of (one line otherwise)
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()
    except (ValueError, KeyError, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"transformers cannot read the config of {path.name}: {first}") from None
    text = json.dumps(config, sort_keys=True)
    atomic_write_text(cached, text)
    return load_json(text)  # as a cache hit reads it (JSON keys are strings): the same config either way


@dataclass
class GgufModel:
    """An opened GGUF file: header, config, architecture row."""

    path: Path
    header: GgufHeader
    config: dict[str, Any]
    arch: Architecture

    @cached_property
    def _names(self):
        gguf = require("gguf")
        archs = {name: key for key, name in gguf.MODEL_ARCH_NAMES.items()}
        if self.header.architecture not in archs:
            raise CheckpointError(
                f"{self.path.name}: gguf-py has no tensor-name table for architecture "
                f"'{self.header.architecture}'; upgrade gguf (pip install -U gguf)"
            )
        blocks = int(self.header.metadata.get(f"{self.header.architecture}.block_count", 0))
        return gguf.get_tensor_name_map(archs[self.header.architecture], blocks)

    def gguf_name(self, hf_name: str) -> str | None:
        """The GGUF name of the transformers tensor ``hf_name`` (``….weight`` / ``….bias``), or None."""
        mapped = self._names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        return mapped if mapped in self.header.tensors else None

    def tensor(self, hf_name: str) -> GgufTensor:
        """The stored tensor for ``hf_name``, or a one-line error naming it."""
        name = self.gguf_name(hf_name)
        if name is None:
            raise CheckpointError(
                f"{self.path.name} has no tensor for {hf_name} (gguf-py's name map for "
                f"'{self.header.architecture}' gives none, or the file lacks it)"
            )
        return self.header.tensors[name]

    def hf_names(self) -> list[str]:
        """Transformers names of the layer-0 modules surgery edits, spelled with every layer prefix of
        the table that maps onto this file's tensors (the resolver picks the prefix from them)."""
        lay = self.arch.layout
        modules = [m for m in (lay.attention.o_proj, lay.mlp.down_proj, lay.mlp.gate_proj, lay.mlp.up_proj) if m]
        return [
            n
            for p in lay.names.layer_prefixes
            for m in modules
            if self.gguf_name(n := f"{self.arch.module_name(p, 0, self.arch.stored_module(m))}.weight")
        ] + self.expert_names()

    def expert_names(self) -> list[str]:
        """The per-expert transformers name of expert 0's gate matrix in the first sparse layer, under
        each layer prefix whose llama.cpp stack of it (``stacked_module``) is in the file: the resolver
        then resolves an expert's matrix to its per-expert name, which :meth:`expert_tensor` maps onto
        the stacked tensor. Empty: the file has no such stack, or the table no per-expert names."""
        lay, sparse = self.arch.layout, self.arch.geometry.sparse_layers
        if not (lay.experts and lay.experts.weights.per_expert and sparse):
            return []
        gate, layer = lay.experts.weights.per_expert[0], min(sparse)
        return [
            f"{self.arch.module_name(p, layer, gate.format(expert=0))}.weight"
            for p in lay.names.layer_prefixes
            if self.gguf_name(f"{self.arch.module_name(p, layer, stacked_module(gate))}.weight")
        ]

    def expert_tensor(self, per_expert: str, expert: int, part: str, shape: tuple[int, ...]) -> tuple[GgufTensor, int]:
        """The stacked 3-D tensor holding ``expert``'s ``part`` matrix ("gate", "up", "down"), whose
        per-expert transformers name is ``per_expert`` and [out, in] shape ``shape``, and the first row
        of the expert's slab in it seen as 2-D [E·out, in]; one-line errors for a file without it."""
        ex = self.arch.layout.experts
        pattern = ex.weights.per_expert[("gate", "up", "down").index(part)]
        own = f"{pattern.format(expert=expert)}.weight"
        t = self.tensor(f"{per_expert.removesuffix(own)}{stacked_module(pattern)}.weight")
        E = self.arch.geometry.num_experts
        if tuple(t.shape) != (E, *shape):
            raise CheckpointError(
                f"{self.path.name}: {t.name} has shape {list(t.shape)}, the config transformers derives "
                f"from its metadata says {[E, *shape]} (where transformers reads no expert sizes it takes "
                "the model class's defaults); import it (surgery import-gguf) with a matching config"
            )
        if f"{t.name.removesuffix('.weight')}.bias" in self.header.tensors:
            raise RecipeError(
                f"{self.path.name}: {t.name} has per-expert biases, which surgery does not edit in GGUF "
                "files yet; import it (surgery import-gguf) and bake the checkpoint"
            )
        return t, expert * shape[0]


def stacked_module(per_expert: str) -> str:
    """The name llama.cpp's converter gives the 3-D stack of a per-expert matrix (``ExpertWeights.per_expert``
    pattern): the pattern without its expert index (``mlp.experts.{expert}.gate_proj`` →
    ``mlp.experts.gate_proj``), which gguf-py's name map then maps to ``ffn_gate_exps``."""
    return per_expert.replace("{expert}.", "")


def read_gguf(path: str | Path) -> tuple[GgufHeader, dict[str, Any]]:
    """A GGUF file's header and transformers config, nothing dequantized; one-line errors for a file
    that is not a complete GGUF of an architecture transformers reads."""
    path = Path(path)
    header = read_gguf_header(path)
    check_complete(path, header)
    return header, _config(path, header)


def open_gguf(path: str | Path) -> GgufModel:
    """Read a GGUF file's header and config and find its architecture row; one-line errors for a
    file that is not a complete GGUF of an architecture surgery can edit."""
    header, config = read_gguf(path)
    return GgufModel(Path(path), header, config, architecture(config))
