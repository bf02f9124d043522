"""What transformers rebuilds at every call while it reads a GGUF, built once per import instead:
the file's metadata, and gguf-py's tensor-name map.

transformers builds the config, the tokenizer's config and the tensor processors' config of a GGUF each
with its own ``load_gguf_checkpoint(path, return_tensors=False)``, which walks every metadata field
with gguf-py's ``GGUFReader``: every vocabulary string, one numpy view at a time (~18 CPU-s for
Gemma-3's 262k-token vocabulary, measured; the dequantization of its weights takes less). Within
:func:`metadata_read_once`, that call returns copies of one reading of the file.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def metadata_read_once(path: Path) -> Iterator[None]:
    """Within the block, transformers' metadata-only ``load_gguf_checkpoint`` of ``path`` reads the file
    once; every call gets its own deep copy (callers may change what they get). Reads of other files,
    and reads with tensors, go to transformers as before."""
    from transformers import modeling_gguf_pytorch_utils as gguf_loading

    real = gguf_loading.load_gguf_checkpoint
    target = Path(path).resolve()
    read: dict[str, Any] = {}

    def load_gguf_checkpoint(gguf_checkpoint_path, return_tensors=False, model_to_load=None, torch_dtype=None):
        if return_tensors or model_to_load is not None or Path(gguf_checkpoint_path).resolve() != target:
            return real(gguf_checkpoint_path, return_tensors, model_to_load, torch_dtype)
        if "metadata" not in read:
            read["metadata"] = real(gguf_checkpoint_path, False, None, torch_dtype)
        return copy.deepcopy(read["metadata"])

    # transformers imports the function from this module at each call (configuration_utils,
    # tokenization_auto), so replacing the module's attribute reaches every reader.
    gguf_loading.load_gguf_checkpoint = load_gguf_checkpoint
    try:
        yield
    finally:
        gguf_loading.load_gguf_checkpoint = real


@contextmanager
def tensor_name_maps_built_once() -> Iterator[None]:
    """Within the block, gguf-py's ``get_tensor_name_map(arch, n_blocks)`` builds each map once.

    transformers' ``get_gguf_hf_weights_map`` recurses into every submodule and asks gguf-py for the
    architecture's whole name table at each one: ~400 builds of one table for a 30-layer model, 8 of
    the 18 CPU-s of SmolLM2-135M's import (measured). The table is only read (``get_name``), so one
    build serves every call.
    """
    import gguf

    real = gguf.get_tensor_name_map
    built: dict[tuple[Any, int], Any] = {}

    def get_tensor_name_map(arch, n_blocks):
        if (arch, n_blocks) not in built:
            built[arch, n_blocks] = real(arch, n_blocks)
        return built[arch, n_blocks]

    # transformers imports the function from gguf's package at each call, so the attribute reaches it.
    gguf.get_tensor_name_map = get_tensor_name_map
    try:
        yield
    finally:
        gguf.get_tensor_name_map = real
