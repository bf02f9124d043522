"""The one table: every model_type surgery edits (``ARCHITECTURES``), joined from its groups, and
the look-ups read from config.json alone (refusal, model class, text config)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .layout import TABLE_LOCATION, Layout
from .refusals import REFUSED
from .table_base import BASE
from .table_dense import DENSE
from .table_hybrid import HYBRID
from .table_moe import MOE
from .table_wrappers import wrappers

# Each group defines its own model types (tests/core/test_families_mla.py: no type twice); the multimodal
# wrappers are rows of the text decoders they wrap.
ARCHITECTURES: dict[str, Layout] = {**BASE, **MOE, **HYBRID, **DENSE}
ARCHITECTURES.update(wrappers(ARCHITECTURES))


def refusal(config: Mapping[str, Any]) -> str | None:
    """Why the table cannot edit a model of this config (one line), or None when it can.

    Read from config.json alone: an unknown or refused model_type, or a wrapper whose text model
    is not the decoder its row describes.
    """
    model_type = str(config.get("model_type"))
    layout = ARCHITECTURES.get(model_type)
    if layout is None and model_type in REFUSED:
        return f"model_type '{model_type}' is not supported: {REFUSED[model_type]}"
    if layout is None:
        return (
            f"model_type '{model_type}' is not supported (supported: {', '.join(sorted(ARCHITECTURES))}); "
            f"to add it, extend {TABLE_LOCATION}"
        )
    text_type = text_config(config).get("model_type")
    if layout.config.text_model_types and text_type is not None and text_type not in layout.config.text_model_types:
        return (
            f"{model_type}: its text_config has model_type '{text_type}', but the table's {model_type} row "
            f"describes a {' or '.join(layout.config.text_model_types)} text decoder; extend {TABLE_LOCATION}"
        )
    return None


def model_class(model_type: str) -> str:
    """The transformers auto class that loads a whole ``model_type`` checkpoint (for a wrapper, with
    its other towers)."""
    layout = ARCHITECTURES.get(model_type)
    return layout.config.model_class if layout else "AutoModelForCausalLM"


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The text-model part of a config dict (the dict itself for plain causal LMs)."""
    layout = ARCHITECTURES.get(str(config.get("model_type")))
    if layout and layout.config.text_config_key:
        return config.get(layout.config.text_config_key) or {}
    return config
