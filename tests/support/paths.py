"""Where things are, for every test wherever it sits in tests/."""

from __future__ import annotations

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
# Real external data (N4, fairness-pruning pairs, BBQ): $SURGERY_SHARED_DATA or ../shared/data next
# to the repository; tests that need it skip when it is absent.
SHARED_DATA = Path(os.environ.get("SURGERY_SHARED_DATA") or REPO.parent / "shared" / "data")


def real_model_path(name: str) -> Path:
    """Where examples/get_models.py leaves a real model ('smollm2-135m-instruct', 'gemma-3-270m'; '.gguf':
    the GGUF files they are imported from)."""
    root = Path(os.environ.get("SURGERY_MODELS", Path.home() / ".cache" / "surgery" / "models"))
    return root / name
