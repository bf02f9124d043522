"""The coverage sweep: every causal-LM model type of the installed transformers is either edited with
proof on a tiny random model, or refused in one line that says why.

A supported type's proof, on a model built from its own config class (tests/support/coverage.py):
every kind of edit its layers offer (heads, MLP neurons, routed- and shared-expert neurons) changes
the run-time output; the bake equals the run-time twin on fp32 logits (≤ 1e-5); exactly the tensors
the sites resolve to change and every other byte (a wrapper's vision or audio tower included) is
identical; ``surgery.verify`` passes; ``surgery.undo`` restores the source byte for byte; the LoRA
export equals the edit, or refuses in one line. The same for a direction edit of every kind of residual
writer the family has (attention output, MLP down, routed and shared experts, embeddings). Every run proves one type per distinct table row
(surgery.core.coverage.representatives); ``pytest -m slow`` proves every supported type.

The test prints the table (``pytest -s``); docs/reference/coverage.md is generated from the same data.
"""

from __future__ import annotations

import pytest

from surgery.core.architectures import ARCHITECTURES, REFUSED, TABLE_LOCATION, architecture
from surgery.core.coverage import SUPPORTED, UNKNOWN, coverage, representatives
from surgery.core.errors import UnsupportedArchitecture
from tests.support.coverage import build_family, prove, prove_direction, save_family, table_mismatches
from tests.support.installed import family_param

ROWS = coverage()
EVERY_RUN = set(representatives())


def _case(model_type: str):
    marks = () if model_type in EVERY_RUN else (pytest.mark.slow(minutes=0.1),)
    return family_param(model_type, *marks)


def test_every_causal_lm_type_is_supported_or_refused():
    width = max(len(r.model_type) for r in ROWS)
    for r in ROWS:
        print(f"{r.model_type:<{width}}  {r.status:<9}  {r.editable}{f'  ({r.reason})' if r.reason else ''}")
    counts = {s: sum(r.status == s for r in ROWS) for s in sorted({r.status for r in ROWS})}
    print(", ".join(f"{n} {status}" for status, n in counts.items()))
    unknown = [r.model_type for r in ROWS if r.status == UNKNOWN]
    assert not unknown, (
        f"new in this transformers: add a row or a refusal to {TABLE_LOCATION} for "
        f"{len(unknown)} model type(s): {', '.join(unknown)}"
    )


def test_no_type_is_both_supported_and_refused():
    assert not set(ARCHITECTURES) & set(REFUSED)


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_refused_in_one_line_with_its_reason(model_type):
    with pytest.raises(UnsupportedArchitecture) as exc:  # decided by the model_type alone
        architecture({"model_type": model_type})
    assert str(exc.value) == f"model_type '{model_type}' is not supported: {REFUSED[model_type]}"
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("model_type", [family_param(r.model_type) for r in ROWS if r.status == SUPPORTED])
def test_the_table_describes_the_model_transformers_builds(model_type):
    """Every supported type, every run (built on the meta device: no weights): each layer's attention
    and dense MLP matrices have the shapes the table derives from config.json, and the attention
    inputs the table says a layer lacks are absent."""
    import torch

    with torch.device("meta"):
        model = build_family(model_type)
    assert table_mismatches(model, architecture(model.config.to_dict())) == []


@pytest.mark.parametrize("model_type", [_case(r.model_type) for r in ROWS if r.status == SUPPORTED])
def test_supported_with_proof(model_type, tmp_path):
    model = build_family(model_type)
    src = save_family(model, tmp_path / "src")
    prove_direction(model, tmp_path / "direction", src)  # before prove(), which wraps the model in its adapter
    prove(model, tmp_path, src)


def test_a_type_new_in_transformers_is_named_not_a_crash(monkeypatch, tmp_path):
    """A release that adds a causal-LM type: the sweep lists it as unknown (and fails naming it), and
    every command on such a checkpoint is one line pointing at the table."""
    from transformers.models.auto import modeling_auto

    monkeypatch.setitem(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "brand_new", "BrandNewForCausalLM")
    (row,) = [r for r in coverage() if r.model_type == "brand_new"]
    assert row.status == UNKNOWN and row.reason == "new in this transformers: add a row or a refusal"
    with pytest.raises(UnsupportedArchitecture) as exc:
        architecture({"model_type": "brand_new", "num_hidden_layers": 2})
    assert str(exc.value).startswith("model_type 'brand_new' is not supported (supported: ")
    assert str(exc.value).endswith(f"to add it, extend {TABLE_LOCATION}") and "\n" not in str(exc.value)
