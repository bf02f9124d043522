"""AutoAWQ GEMM weights: the int4 asymmetric group layout of int_packed/, stored transposed in AWQ's words
(storage.py), read and written through compressed-tensors' converter; planned, checked and loaded as
int_packed/ does."""

from __future__ import annotations

from typing import Any

from ..int_packed import IntPacked


class Awq(IntPacked):
    """An AutoAWQ GEMM checkpoint (``quant_method`` awq, 4 bits, zero points)."""

    name = "awq"
    offered = "an int4 AutoAWQ GEMM"

    @classmethod
    def detect(cls, qconfig: Any) -> Awq | None:
        from .storage import scheme

        s = scheme(qconfig)
        return cls(s) if s is not None else None

    @classmethod
    def refusal(cls, qconfig: Any) -> str | None:
        from .storage import refusal

        why = refusal(qconfig)
        return None if why is None else f"AutoAWQ weights that surgery cannot edit exactly: {why}"
