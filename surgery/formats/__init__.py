"""The stored formats surgery bakes into, one subpackage each, registered by subclassing
:class:`~surgery.core.stored_format.StoredFormat`: plain floats (``plain.py``), FP8 e4m3
(``fp8/``), int4 / int8 compressed-tensors (``int_packed/``), AutoAWQ GEMM (``awq/``), NVFP4
compressed-tensors (``nvfp4/``) and gpt-oss MXFP4 (``mxfp4/``).

Importing this package registers them (``import surgery`` does); the order is the order in which a
checkpoint's config is tried, plain floats being what none of the others recognises.
docs/contributing/adding-a-format.md adds one.
"""

from ..core.stored_format import StoredFormat

# isort: off
from . import plain, fp8, int_packed, awq, nvfp4, mxfp4  # registered in this order: the order of detect and of refusals
# isort: on

__all__ = ["StoredFormat", "awq", "fp8", "int_packed", "mxfp4", "nvfp4", "plain"]
