"""GGUF block types, one registered plug-in each: what an edit can do to a tensor's blocks, exactly,
and the edit itself (the base and its registry: ``base.py``).

The families: float types edited value by value (``floats.py``); block types whose values follow f16
scale fields, the legacy quants, K-quants, IQ and ternary types (``scaled.py``); MXFP4, whose E8M0
exponent carries a power of two and whose codes zero single values (``mxfp4.py``); NVFP4, the same
with an e4m3 scale per group of 16 values (``nvfp4.py``). Importing this
package registers them, in the order that refusals list them. docs/contributing/adding-a-format.md
adds one.
"""

from .base import (
    Edited,
    GgufBlockType,
    PartialEdit,
    QuantizedBlocks,
    block_type,
    registered,
    requantizable,
    supported,
)

# isort: off
from . import floats, scaled, mxfp4, nvfp4  # registered in this order: the order refusals list them in
# isort: on

__all__ = [
    "Edited",
    "GgufBlockType",
    "PartialEdit",
    "QuantizedBlocks",
    "block_type",
    "floats",
    "mxfp4",
    "nvfp4",
    "registered",
    "requantizable",
    "scaled",
    "supported",
]
