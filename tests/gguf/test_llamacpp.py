"""llama.cpp runs the GGUFs surgery baked: the real SmolLM2-135M-Instruct Q4_1 file edited five ways
(40 neurons pruned, another 40 drawn at random, one head α 2, α 0.5, prune and α 2 together) and
Gemma-3-270M Q4_K_M four (α 0.5 is not exact there), and SmolLM2 with its decoder matrices in MXFP4
(GGUF type 39, encoded by gguf-py: examples/fp4_gguf.py) the same five ways and in NVFP4 (type 40,
encoded by ggml) four (α 0.5 is not exact there), run by llama.cpp through
llama-cpp-python over 8 prompts (examples/llamacpp_logits.py makes the table and prints it).

What the measurement showed (8 prompts, plain text; mean |Δlogit| per prompt), and so what is asserted:
- llama.cpp computes every edited file bit for bit as it computes its own run-time edit of the
  source file (the pruned neurons' gated activations zeroed, the head's attention output scaled,
  through llama.cpp's graph callback), in SmolLM2's Q4_1, in Gemma-3's Q4_K_M mix and in MXFP4 and NVFP4 alike: the
  bytes are the edit, in llama.cpp's arithmetic too. Whatever separates llama.cpp from transformers
  on an edited file is llama.cpp's engine on the edited model, which no other bytes would fix.
- The pruned neurons are silent in llama.cpp: their activation (the down projection's input) is 0.0
  on every token, where the source file's is not.
- The issue's criterion (the edited file in llama.cpp no further from the run-time edit in
  transformers than the source file in llama.cpp from transformers) holds for the issue's example,
  SmolLM2 with 40 neurons pruned, on the mean and the median over the prompts (0.209 / 0.207 vs the
  source's 0.218 / 0.212); asserted there. It is not a property of the file: llama.cpp's own error
  (8-bit activations in every quantized matrix product) is a property of the model it runs, and an
  edit changes it either way. Paired over the prompts, the edited file's excess over the source's
  difference was: SmolLM2 plain text, every case within ±0.012 (not significant); SmolLM2 in its
  chat template (examples/llamacpp_logits.py table --chat), prune +0.018 ± 0.006, head α 2
  +0.049 ± 0.004, prune + α 2 +0.073 ± 0.009 (up to 30 % over the source's 0.243), random prune
  −0.013, α 0.5 −0.004; Gemma-3 plain text, prune +0.008 ± 0.003 (4 %), random prune −0.006.
  Those are not asserted.
- The engines' changes correlate (≥ 0.8) where the edit moves the logits at least twice as much as
  llama.cpp's own error (the head α 2 cases: 0.95); a prune or α 0.5 moves them about as much as
  that error (0.25-0.33 vs 0.22), so there the correlation (0.66-0.81) measures the error, not the
  edit, and is not asserted.

Needs the real files (``python examples/get_models.py``) and a virtual environment with
llama-cpp-python, named by ``SURGERY_LLAMACPP_PYTHON`` (.ci/run builds one when time allows).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO, real_model_path

pytestmark = pytest.mark.llamacpp(minutes=10)


def _table_module():
    spec = importlib.util.spec_from_file_location("llamacpp_logits", REPO / "examples" / "llamacpp_logits.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """``tables(name)``: the source's engine difference and the cases' rows for ``SPECS[name]``,
    measured once per module (a few minutes each)."""
    python = os.environ.get("SURGERY_LLAMACPP_PYTHON")
    if not python or not Path(python).is_file():
        pytest.skip("set SURGERY_LLAMACPP_PYTHON to the python of a virtual environment with llama-cpp-python")
    lc = _table_module()
    measured: dict[str, tuple] = {}

    def table(name: str):
        spec = lc.SPECS[name]
        if not (real_model_path(".gguf") / spec.file).is_file() or not real_model_path(spec.imported).is_dir():
            pytest.skip("run `python examples/get_models.py` first")
        if name not in measured:
            engines, rows = lc.measure(name, python, tmp_path_factory.mktemp(name))
            lc.print_table(name, engines, rows)
            measured[name] = engines, {r.name: r for r in rows}
        return measured[name]

    return table


@pytest.fixture
def table(tables):
    return tables("smollm2")


@pytest.mark.parametrize("name", ["smollm2", "gemma", "smollm2-mxfp4", "smollm2-nvfp4"])
def test_llamacpp_computes_the_edited_file_as_its_own_run_time_edit(tables, name):
    _, rows = tables(name)
    for row in rows.values():
        assert row.bytes_vs_engine.largest == 0.0, row.name
        assert row.edit_size.largest > 0.0, row.name  # the edit did change llama.cpp's logits


@pytest.mark.parametrize("name", ["smollm2", "gemma", "smollm2-mxfp4", "smollm2-nvfp4"])
def test_pruned_neurons_are_silent_in_llamacpp(tables, name):
    _, rows = tables(name)
    pruned = [r for r in rows.values() if r.silent is not None]
    assert len(pruned) == 3
    for row in pruned:
        assert row.silent == 0.0, row.name
        assert row.active > 0.0, row.name  # the same neurons fire in the source file


def test_the_issues_criterion_holds_for_the_issues_example(table):
    engines, rows = table
    pruned = rows["prune 40"].edited_vs_edit
    assert pruned.mean <= engines.mean
    assert pruned.median <= engines.median


def test_llamacpp_moves_as_transformers_where_the_edit_exceeds_llamacpps_error(table):
    engines, rows = table
    moved = [r for r in rows.values() if r.edit_size.mean >= 2 * engines.mean]
    assert moved  # the head α 2 cases
    for row in moved:
        assert row.correlation >= 0.8, row.name
