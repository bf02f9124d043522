"""Scales a bake refuses before it writes anything: one that rounds every weight of a head or a
neuron to zero (unless asked for), and one that makes them inf or too large to compute with.

Both are decided in the bake's own arithmetic (surgery.core.patches): a weight times the scale in
float32, rounded once to the stored dtype. Rounding is monotone in |value|, so the largest |weight|
an edit scales decides for all of them: when it rounds to 0 every weight does, and when it stays
finite and below ``HUGE`` every weight does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..core import e4m3
from ..core.checkpoint import Checkpoint
from ..core.edits import Edit, Recipe
from ..core.errors import RecipeError
from ..core.patches import HUGE, site_peaks
from ..core.raw_values import from_f32, to_f32


def scaled_peak(peak: float, scale: float, dtype: str) -> float:
    """``peak`` × ``scale`` as the bake stores it: float32 product, rounded once to ``dtype``."""
    with np.errstate(over="ignore"):  # an overflow is the answer (inf), not a warning
        product = np.array([peak], dtype=np.float32) * np.float32(scale)
        return float(to_f32(from_f32(product, dtype), dtype)[0])


def scale_problem(e: Edit, scale: float, peak: float, dtype: str, allow_zero: bool) -> str | None:
    """Why the bake refuses scaling by ``scale`` the weights of ``e`` whose largest |value| is
    ``peak`` in ``dtype``, or None. The message names the scale as the recipe does (``alpha 2``),
    and the switch ``allow_zero`` as a ``{allow_zero}`` placeholder (surgery.core.errors)."""
    named, what = f"{e.scale_key} {scale:g}", f"{e.kind} {e.label}"
    new = scaled_peak(peak, scale, dtype)
    if not math.isfinite(new):
        return f"{named} overflows {dtype} for {what} (its weights would become inf); choose a smaller scale"
    if abs(new) >= HUGE:
        return (
            f"{named} scales the weights of {what} up to {abs(new):.2g}, past 2^64 ≈ 1.8e19: the "
            "activations they write overflow float32 in the next norm, which squares them; choose a smaller scale"
        )
    if peak and new == 0 and not allow_zero:
        return (
            f"{named} rounds every weight of {what} to zero in this {dtype} checkpoint: like "
            f"{e.scale_key} 0 it silences the {e.kind}; pass {{allow_zero}} if that is what "
            f"you want, or choose a larger {e.scale_key}"
        )
    return None


def check_scales(ckpt: Checkpoint, recipes: Recipe | Sequence[Recipe], *, allow_zero: bool = False) -> None:
    """Refuse, in one line, a scale that makes a head's or neuron's weights inf or past ``HUGE``,
    or (unless ``allow_zero``) rounds them all to zero; exact 0 is pruning and always allowed.

    Give every recipe of a sweep at once: each edited tensor is read once, and a refused value
    leaves nothing written.
    """
    recipes = [recipes] if isinstance(recipes, Recipe) else list(recipes)
    if not recipes:
        return
    for recipe in recipes:  # each must fit the model before its bytes are read
        arch = recipe.validate(ckpt.config)
    if not ckpt.format.guarded:  # its codes and scales are edited exactly or refused (surgery/formats/)
        return
    edits = list(dict.fromkeys(e for r in recipes for e in r.active()))
    for e, site, peak, dtype in site_peaks(ckpt, arch, edits):
        if dtype == e4m3.DTYPE:  # e4m3 bytes are scaled exactly or refused (surgery/formats/fp8/), never rounded
            continue
        problem = scale_problem(e, site.scale, peak, dtype, allow_zero)
        if problem:
            raise RecipeError(problem, switches=("allow_zero",))
