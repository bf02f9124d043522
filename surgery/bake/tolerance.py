"""How far ``surgery verify`` lets the baked model's logits lie from the run-time edit's.

The two compute the same function in different float arithmetic: the baked weights are the edit
rounded once to the stored dtype, the run-time twin applies it to the source weights on every
call (an input scale, or y − w·r(rᵀy) after the matrix), so each layer's output differs by a few
unit roundoffs ``u`` of its size. The residual stream carries every layer's difference on to the
logits, which inherit it relative to their own size. So the tolerance scales with the three:

    tolerance = FACTOR · u · max|logit| · layers

``u``: the unit roundoff of the coarsest of the compute dtype and the edited weights' stored dtype
(the bake rounds to the one, the model computes in the other); ``max|logit|``: the largest logit of
the run-time edit on the check prompts; ``layers``: the decoder layers, each one more rounding
added to the residual stream (linear: the worst case, not the random walk's square root, so a deep
model is never failed for its depth). FACTOR is measured (see :data:`FACTOR`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .check import UNIT_ROUNDOFF

# Measured: the largest |Δlogit| / (u · max|logit| · layers) of a correct bake was 3.7 on 2 AVX2 cores
# over the tiny models of the nine dense families of tests/support/tiny.py in float32, bfloat16 and
# float16, head and neuron scales or a direction ablated from every layer (their logits, below 1, are
# smaller than the hidden states whose rounding they carry); 2.8 on SmolLM2-135M in float32 with a
# direction ablated from all 30 layers' attention and MLP writers (Δ 1.4e-4 at max|logit| 28.8; 2.0e-4
# at 35 on another run), 0.6 computed in bfloat16 (Δ 2.0) and 0.6 in float16 (Δ 0.27); and 16.3 on an
# AVX-512 CPU for gemma4_text's tiny model (tests/core/test_coverage.py: Δ 3.8e-6 at max|logit| 0.97,
# its hidden states far larger than its logits). Four times the largest: a correct bake passes on other
# CPUs' kernels too, while a damaged weight still fails (a flipped sign or exponent bit moves the logits
# by far more than a rounding: tests/bake/test_tolerance.py), and verify checks every edited byte first.
FACTOR = 64.0


@dataclass(frozen=True)
class LogitTolerance:
    """The tolerance and what it was derived from (the report states both)."""

    value: float
    dtype: str  # whose unit roundoff: the coarsest of the compute dtype and the edited weights' dtypes
    unit_roundoff: float
    max_abs_logit: float
    layers: int
    factor: float = FACTOR

    def describe(self) -> str:
        """``16 · u(F32) 5.96e-08 · max|logit| 35.2 · 30 layers``: the derivation in one line."""
        return (
            f"{self.factor:g} · u({self.dtype}) {self.unit_roundoff:.3g} · max|logit| {self.max_abs_logit:.3g} "
            f"· {self.layers} layers"
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "formula": "factor · unit_roundoff · max_abs_logit · layers"}


def logit_tolerance(dtypes: set[str], max_abs_logit: float, layers: int) -> LogitTolerance:
    """The tolerance for logits of size ``max_abs_logit`` after ``layers`` layers, computed or stored
    in ``dtypes`` (safetensors names; one not listed counts as bfloat16, the coarsest)."""
    dtype = max(dtypes, key=lambda d: UNIT_ROUNDOFF.get(d, UNIT_ROUNDOFF["BF16"]))
    u = UNIT_ROUNDOFF.get(dtype, UNIT_ROUNDOFF["BF16"])
    layers = max(1, layers)
    return LogitTolerance(FACTOR * u * max_abs_logit * layers, dtype, u, max_abs_logit, layers)
