"""Which causal-LM model types of the installed transformers surgery edits, and which it refuses.

The facts are the table's (surgery/core/architectures/): the rows of ``ARCHITECTURES`` and the
reasons of ``REFUSED``. This module crosses them with transformers' own list of causal-LM model
types, for the coverage sweep (tests/core/test_coverage.py, which proves every supported type on a
tiny random model) and the generated page docs/reference/coverage.md. A type transformers lists
that the table neither supports nor refuses is ``unknown``: new in this transformers release.
"""

from __future__ import annotations

from dataclasses import dataclass

from .architectures import ARCHITECTURES, REFUSED, Layout

SUPPORTED, REFUSED_STATUS, UNKNOWN = "supported", "refused", "unknown"


@dataclass(frozen=True)
class Coverage:
    """One model type: ``status`` (supported, refused, unknown), what an edit may touch in it, and
    the reason it is refused (or what to do about an unknown type)."""

    model_type: str
    status: str
    editable: str
    reason: str = ""


def causal_lm_types() -> list[str]:
    """Every model type the installed transformers maps to a causal-LM class."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def editable(layout: Layout) -> str:
    """What a row lets an edit touch, from the layout alone (the config decides which layers)."""
    lk, mk, ex = layout.layers.layer_kinds, layout.layers.mlp_kinds, layout.experts
    parts = [f"heads ({' and '.join(lk.editable)} layers)" if lk else "heads"]
    if mk is not None:  # a hybrid's or a DeepSeek-style MoE's kinds of MLP: neurons in the dense ones
        parts += [f"MLP neurons ({' and '.join(mk.editable)} layers)"] if mk.editable else []
    elif ex is None or ex.layers.with_dense:
        parts.append("MLP neurons")
    elif ex.layers.rule.step_key or ex.layers.rule.dense_layers_key:
        parts.append("MLP neurons (dense layers)")
    if mixer := layout.layers.mixer:  # a residual writer only a direction edit touches
        where = "every layer" if mixer.kinds is None else " and ".join(mixer.kinds) + " layers"
        parts.append(f"directions through {mixer.module} ({where})")
    if ex is not None:
        parts.append("routed-expert neurons" + (" (not the zero-computation experts)" if ex.keys.zero_key else ""))
        if ex.shared:
            parts.append("shared-expert neurons")
    if layout.layers.sub_layers > 1:
        parts.append(f"layer {layout.layers.sub_layers}·L + i = block i of decoder layer L")
    if layout.config.text_model_types:
        parts.append(f"in the {' or '.join(layout.config.text_model_types)} text decoder (other towers untouched)")
    return ", ".join(parts)


def coverage() -> list[Coverage]:
    """Every causal-LM type of the installed transformers and every type of the table, by name."""
    rows = []
    for model_type in sorted(set(causal_lm_types()) | set(ARCHITECTURES) | set(REFUSED)):
        if model_type in ARCHITECTURES:
            rows.append(Coverage(model_type, SUPPORTED, editable(ARCHITECTURES[model_type])))
        elif model_type in REFUSED:
            rows.append(Coverage(model_type, REFUSED_STATUS, "nothing", REFUSED[model_type]))
        else:
            rows.append(Coverage(model_type, UNKNOWN, "nothing", "new in this transformers: add a row or a refusal"))
    return rows


def representatives() -> list[str]:
    """One supported type per distinct row of the table (the first in table order): what every test
    run proves; the types whose row equals an earlier one differ only inside transformers' modeling
    code, and ``pytest -m slow`` proves each of them too."""
    seen: list[Layout] = []
    out = []
    for model_type, layout in ARCHITECTURES.items():
        if layout not in seen:
            seen.append(layout)
            out.append(model_type)
    return out
