"""The coverage sweep: every causal-LM model type of the installed transformers is either edited with
proof on a tiny random model, or refused in one line that says why.

A supported type's proof, on a model built from its own config class (tests/support/families.py):
every kind of edit its layers offer (heads, MLP neurons, routed- and shared-expert neurons) changes
the run-time output; the bake equals the run-time twin on fp32 logits (≤ 1e-5); exactly the tensors
the sites resolve to change and every other byte (a wrapper's vision or audio tower included) is
identical; ``surgery.verify`` passes; ``surgery.undo`` restores the source byte for byte; the LoRA
export equals the edit, or refuses in one line. Every run proves one type per distinct table row
(surgery.core.coverage.representatives); ``pytest -m slow`` proves every supported type.

The test prints the table (``pytest -s``); docs/reference/coverage.md is generated from the same data.
"""

from __future__ import annotations

import json

import pytest
import torch

import surgery
from surgery.core.architectures import ARCHITECTURES, REFUSED, TABLE_LOCATION, architecture
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.coverage import SUPPORTED, UNKNOWN, coverage, representatives
from surgery.core.edits import Recipe
from surgery.core.errors import RecipeError, UnsupportedArchitecture
from surgery.core.resolve import Resolver
from surgery.core.sites import all_sites
from tests.support.families import MAX_PARAMETERS, build_family, proof_edits, save_family
from tests.support.models import load_fp32, logits, stored_tensors

ROWS = coverage()
EVERY_RUN = set(representatives())


def _case(model_type: str):
    marks = () if model_type in EVERY_RUN else pytest.mark.slow(minutes=0.1)
    return pytest.param(model_type, marks=marks, id=model_type)


def test_every_causal_lm_type_is_supported_or_refused():
    width = max(len(r.model_type) for r in ROWS)
    for r in ROWS:
        print(f"{r.model_type:<{width}}  {r.status:<9}  {r.editable}{f'  ({r.reason})' if r.reason else ''}")
    counts = {s: sum(r.status == s for r in ROWS) for s in sorted({r.status for r in ROWS})}
    print(", ".join(f"{n} {status}" for status, n in counts.items()))
    unknown = [r.model_type for r in ROWS if r.status == UNKNOWN]
    assert not unknown, (f"new in this transformers: add a row or a refusal to {TABLE_LOCATION} for "
                         f"{len(unknown)} model type(s): {', '.join(unknown)}")


def test_no_type_is_both_supported_and_refused():
    assert not set(ARCHITECTURES) & set(REFUSED)


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_refused_in_one_line_with_its_reason(model_type):
    with pytest.raises(UnsupportedArchitecture) as exc:  # decided by the model_type alone
        architecture({"model_type": model_type})
    assert str(exc.value) == f"model_type '{model_type}' is not supported: {REFUSED[model_type]}"
    assert "\n" not in str(exc.value)


def _bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("model_type", [_case(r.model_type) for r in ROWS if r.status == SUPPORTED])
def test_supported_with_proof(model_type, tmp_path):
    model = build_family(model_type)
    assert sum(p.numel() for p in model.parameters()) <= MAX_PARAMETERS
    src = save_family(model, tmp_path / "src")
    ckpt = Checkpoint(src)
    arch = architecture(ckpt.config)
    groups = proof_edits(arch)
    assert "heads" in groups and {"neurons", "experts"} & set(groups), groups
    recipe = Recipe(tuple(e for edits in groups.values() for e in edits))

    # every kind of edit does something at run time (the proof is not vacuous)
    base = logits(model)
    for name, edits in groups.items():
        assert (logits(model, edits) - base).abs().max().item() > 1e-4, f"the {name} edits change nothing"
    twin = logits(model, recipe.edits)

    surgery.apply(recipe, src, tmp_path / "baked")  # the bake and its own check of each edited map
    baked = tmp_path / "baked"
    assert (logits(load_fp32(baked)) - twin).abs().max().item() <= 1e-5

    # exactly the tensors the sites resolve to change; every other byte is the source's
    before, after = stored_tensors(src), stored_tensors(baked)
    resolved = {sl.tensor for sl in Resolver(arch, ckpt.tensors).all(all_sites(arch, recipe.active()))}
    assert before.keys() == after.keys()
    assert {n for n in before if not _bytes_equal(before[n], after[n])} == resolved
    if arch.layout.text_model_types:  # a wrapper: its other towers are there (and untouched, above)
        text = arch.layer_prefix(before).split("layers.")[0]
        assert [n for n in before if not n.startswith((text, "lm_head."))]
    assert (src / "config.json").read_bytes() == (baked / "config.json").read_bytes()
    recorded = {e["tensor"] for e in json.loads((baked / "surgery.json").read_text())["edited_tensors"]}
    assert recorded == resolved

    report = surgery.verify(src, baked)
    assert report.ok, report.problems
    surgery.undo(baked, tmp_path / "restored")
    for f in src.iterdir():
        assert file_sha256(f) == file_sha256(tmp_path / "restored" / f.name), f.name

    # the LoRA adapter equals the edits it can carry; the others are refused in one line
    exact = tuple(e for e in recipe.active() if e.lora_refusal(arch) is None)
    if len(exact) < len(recipe.active()):
        with pytest.raises(RecipeError) as exc:
            surgery.export_lora(src, recipe, tmp_path / "refused")
        assert "\n" not in str(exc.value) and not (tmp_path / "refused").exists()
    expected = twin if len(exact) == len(recipe.active()) else logits(model, exact)
    surgery.export_lora(src, Recipe(exact), tmp_path / "adapter")
    from peft import PeftModel

    adapted = PeftModel.from_pretrained(model, tmp_path / "adapter").eval()  # wraps ``model``: last use
    assert (logits(adapted) - expected).abs().max().item() <= 1e-5
