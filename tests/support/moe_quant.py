"""Checks shared by the quantized mixture-of-experts bake tests (FP8, compressed-tensors int, AutoAWQ):
an expert-neuron recipe baked as releases store experts (one tensor per expert), compared with the same
edit of the source dequantized by the format's own library."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from surgery.bake.undo import undo
from surgery.bake.verify import verify
from surgery.core.architectures import architecture
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import SHARED, NeuronScale

# routed neurons of experts 1 and 3, and a shared-expert neuron, pruned
PRUNED = (NeuronScale(1, 3, 0.0, 1), NeuronScale(2, 15, 0.0, 3), NeuronScale(1, 4, 0.0, SHARED))


def _matrices(edit: NeuronScale, experts) -> tuple[list[str], str]:
    """(input matrices, down matrix) of the edited neuron's expert as X.weight names, from the architecture
    table's ``experts`` (Mixtral's w1 / w3 / w2, Qwen's gate_proj / up_proj / down_proj, the shared expert's)."""
    layer = f"model.layers.{edit.layer}."
    if edit.expert == SHARED:
        base = layer + experts.shared.module + "."
        return [base + m + ".weight" for m in experts.shared.inputs], base + experts.shared.down + ".weight"
    gate, up, down = (layer + name.format(expert=edit.expert) + ".weight" for name in experts.weights.per_expert)
    return [gate, up], down


def _expected(dequantized, edits, experts) -> dict[str, torch.Tensor]:
    """The edit of the dequantized source: the neuron's down column × factor; pruned, its gate/up rows 0."""
    out: dict[str, torch.Tensor] = {}

    def get(name: str) -> torch.Tensor:
        return out.setdefault(name, dequantized(name).clone())

    for e in edits:
        inputs, down = _matrices(e, experts)
        get(down)[:, e.neuron] *= e.factor
        if e.factor == 0.0:
            for name in inputs:
                get(name)[e.neuron] = 0.0
    return out


def check_expert_bake(src, out, tmp_path, recipe, dequantized) -> None:
    """The bake of ``recipe`` at ``out``: exact against the dequantized source, the rest untouched,
    verified (logits too: every layout loads dequantized) and undone byte for byte."""
    experts = architecture(Checkpoint(src).config).layout.experts
    expected = _expected(lambda name: dequantized(src, name), recipe.edits, experts)
    for name, values in expected.items():
        assert torch.equal(dequantized(out, name), values), name
    # every tensor of a module the recipe does not touch is byte-identical (the routers among them)
    touched = {name.removesuffix("weight") for name in expected}
    a, b = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        if not any(name.startswith(t) for t in touched):
            assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name
    report = verify(Checkpoint(src), out)
    assert report.ok, report.problems
    assert report.numeric_check.startswith("dequantized weights")
    assert "logits" in report.numeric_check and report.max_abs_logit_diff <= report.tolerance
    undo(out, tmp_path / "restored")
    for f in ("model.safetensors", "config.json"):
        assert file_sha256(tmp_path / "restored" / f) == file_sha256(src / f)
