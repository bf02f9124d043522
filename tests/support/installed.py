"""Which model types the installed transformers knows: a table row added for a newer release is
skipped by name on an older one (its config class does not exist there), never silently dropped."""

from __future__ import annotations

from typing import Any

import pytest


def in_transformers(model_type: str) -> bool:
    """Whether the installed transformers has a config class for ``model_type``."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return model_type in CONFIG_MAPPING_NAMES


def family_param(model_type: str, *marks: Any) -> Any:
    """``model_type`` as a pytest parameter with ``marks``, skipped when transformers lacks it."""
    import transformers

    if not in_transformers(model_type):
        marks = (*marks, pytest.mark.skip(reason=f"{model_type} is not in transformers {transformers.__version__}"))
    return pytest.param(model_type, marks=marks, id=model_type)
