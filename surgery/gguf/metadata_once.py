"""Read a GGUF's metadata through transformers once per import, not once per object built from it.

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
