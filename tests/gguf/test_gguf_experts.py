"""Routed-expert and shared-expert neurons baked into a MoE GGUF (qwen2moe: llama.cpp stacks the
experts in 3-D ``ffn_{gate,up,down}_exps`` tensors): dequantize(edited file) equals the edit applied to
dequantize(source) exactly, every other byte is the source's, verify passes, undo gives the source
byte for byte; the baked file as transformers loads it equals the run-time twin on the source."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from surgery.bake.gguf import bake_gguf
from surgery.bake.gguf_verify import undo_gguf, verify_gguf
from surgery.core.edits import SHARED, NeuronScale, Recipe
from surgery.core.errors import RecipeError
from surgery.gguf.blocks import block_type
from surgery.gguf.header import tensor_bytes
from surgery.gguf.model import open_gguf
from surgery.gguf.plan import plan_gguf
from tests.support.moe_gguf import EXPERT, EXPERTS, kind_of, write_moe_gguf
from tests.support.moe_gguf import SHARED as SHARED_SIZE
from tests.support.typed_gguf import TOKENS, tensor_values

# (layer, neuron, expert): the first and last neuron of the first and last expert, a shared neuron.
PRUNED = ((0, 3, 1), (1, EXPERT - 1, EXPERTS - 1), (1, 0, 0), (0, 4, SHARED), (1, SHARED_SIZE - 1, SHARED))


def recipe(pruned=PRUNED, amplified=()) -> Recipe:
    edits = [(*p, 0.0) for p in pruned] + list(amplified)
    return Recipe(tuple(NeuronScale(layer, n, alpha, e) for layer, n, e, alpha in edits))


def expected(values: dict[str, np.ndarray], path, pruned=PRUNED, amplified=()) -> dict[str, np.ndarray]:
    """The neurons' edits applied to dequantized source tensors, written out from what they mean:
    expert e's neuron n is row n of ``gate/up_exps[e]`` and column n of ``down_exps[e]``; a shared
    neuron is row n of ``gate/up_shexp`` and column n of ``down_shexp``."""
    out = {k: v.copy() for k, v in values.items()}
    types = {t.name: t.type for t in open_gguf(path).header.tensors.values()}
    for layer, n, e, alpha in [(*p, 0.0) for p in pruned] + list(amplified):
        suffix, slab = ("shexp", ()) if e == SHARED else ("exps", (e,))
        gate, up, down = (f"blk.{layer}.ffn_{p}_{suffix}.weight" for p in ("gate", "up", "down"))
        if alpha == 0.0:  # pruned: its gate and up rows are zero
            out[gate][(*slab, n)] = 0
            out[up][(*slab, n)] = 0
        if alpha != 0.0 or block_type(types[down]).zeroes_values:  # a single zero is exact only there
            out[down][(*slab, slice(None), n)] *= np.float32(alpha)
    return out


EDITED = [f"blk.{la}.ffn_{p}_{s}.weight" for la in (0, 1) for p in ("gate", "up", "down") for s in ("exps", "shexp")]


def check_bake(src, out, result, want_edit) -> None:
    """Edited tensors are ``want_edit`` exactly; every other byte is the source's; verify and undo work."""
    before = {n: tensor_values(src, n) for n in EDITED}
    want = want_edit(before)
    for name in EDITED:
        assert np.array_equal(tensor_values(out, name), want[name]), name
    a, b = src.read_bytes(), out.read_bytes()
    assert len(a) == len(b)
    header = open_gguf(src).header
    first = min(t.offset for t in header.tensors.values())
    assert a[:first] == b[:first]  # metadata and tensor table
    edited = {e.tensor for e in result.provenance.edited_tensors}
    for t in header.tensors.values():
        span = slice(t.offset, t.offset + tensor_bytes(t))
        assert (a[span] == b[span]) == (t.name not in edited), t.name
    assert verify_gguf(out, src).ok
    undo_gguf(out, out.with_name("restored.gguf"))
    assert out.with_name("restored.gguf").read_bytes() == a


@pytest.mark.parametrize("kind", ["F32", "Q8_0", "Q4_0", "Q4_K"])
def test_expert_neurons_bake_exactly_and_touch_nothing_else(tmp_path, kind):
    src, out = tmp_path / "src.gguf", tmp_path / "out.gguf"
    write_moe_gguf(src, kind)
    result = bake_gguf(open_gguf(src), recipe(), out)
    check_bake(src, out, result, lambda v: expected(v, src))
    edited = {e.tensor for e in result.provenance.edited_tensors}
    assert {"blk.0.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight", "blk.0.ffn_gate_shexp.weight"} <= edited
    # Down columns: zeroed in F32/Q8_0, left with a note where one value cannot be zeroed (Q4_0, Q4_K).
    down_zeroed = block_type(kind_of("blk.0.ffn_down_exps", kind)).zeroes_values
    assert ("blk.0.ffn_down_exps.weight" in edited) == down_zeroed
    assert any("left as is" in n for n in result.notes) == (not block_type(kind).zeroes_values)


def test_amplified_expert_neuron_scales_its_own_slab_only(tmp_path):
    """Amplify: expert e's down column n scales in e's [H, I] slab, not in the other experts'."""
    src, out = tmp_path / "src.gguf", tmp_path / "out.gguf"
    write_moe_gguf(src, "F32")
    amplified = ((0, 7, 2, 2.0), (1, 7, 0, 0.5))
    result = bake_gguf(open_gguf(src), recipe(pruned=(), amplified=amplified), out)
    check_bake(src, out, result, lambda v: expected(v, src, pruned=(), amplified=amplified))
    assert {e.tensor for e in result.provenance.edited_tensors} == {
        "blk.0.ffn_down_exps.weight",
        "blk.1.ffn_down_exps.weight",
    }


def _logits(path, edits=()) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    from surgery.model.hooks import applied

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.randint(3, len(TOKENS), (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), applied(model, list(edits)):
        return model(input_ids=ids).logits


@pytest.mark.parametrize("kind", ["F32", "Q8_0"])
def test_baked_moe_gguf_equals_the_run_time_twin(tmp_path, kind):
    """transformers loads the baked file (dequantized) to the logits of the source with the recipe
    applied at run time (where every down column is zeroed too: F32, Q8_0)."""
    src, out = tmp_path / "src.gguf", tmp_path / "out.gguf"
    write_moe_gguf(src, kind)
    r = recipe(amplified=((0, 9, 1, 2.0),) if kind == "F32" else ())
    bake_gguf(open_gguf(src), r, out)
    base, twin = _logits(src), _logits(src, r.edits)
    assert (twin - base).abs().max().item() > 1e-4  # the edits move the logits: not vacuous
    assert (_logits(out) - twin).abs().max().item() <= 1e-5


def test_expert_index_past_the_last_is_one_line_and_writes_nothing(tmp_path):
    src, out = tmp_path / "src.gguf", tmp_path / "out.gguf"
    write_moe_gguf(src, "Q8_0")
    with pytest.raises(RecipeError, match=f"expert = {EXPERTS} .*{EXPERTS} experts") as err:
        bake_gguf(open_gguf(src), recipe(pruned=((0, 3, EXPERTS),)), out)
    assert "\n" not in str(err.value)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("out")]  # nor its sidecars
    # The plan itself (what verify re-runs on a recorded recipe) refuses it too, not reading past the stack.
    with pytest.raises(RecipeError, match=f"expert {EXPERTS} of layer 0 does not exist"):
        plan_gguf(open_gguf(src), recipe(pruned=((0, 3, EXPERTS),)))


def test_stacked_experts_with_biases_are_refused_in_one_line(tmp_path):
    """GPT-OSS-style per-expert biases next to the stack: refused, nothing written."""
    src, out = tmp_path / "src.gguf", tmp_path / "out.gguf"
    write_moe_gguf(src, "F32", extra={"blk.0.ffn_gate_exps.bias": np.zeros((EXPERTS, EXPERT), np.float32)})
    with pytest.raises(RecipeError, match="blk.0.ffn_gate_exps.weight has per-expert biases") as err:
        bake_gguf(open_gguf(src), recipe(pruned=((0, 3, 1),)), out)
    assert "\n" not in str(err.value)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("out")]


def test_experts_without_per_expert_names_are_refused_in_one_line(tmp_path):
    """A family whose table row has no per-expert names (GPT-OSS) cannot be matched to llama.cpp's
    stacks: one line naming the cause, while its shared-expert neurons still bake."""
    src = tmp_path / "src.gguf"
    write_moe_gguf(src, "Q8_0")
    model = open_gguf(src)
    layout = model.arch.layout
    experts = replace(layout.experts, weights=replace(layout.experts.weights, per_expert=None))
    model = replace(model, arch=replace(model.arch, layout=replace(layout, experts=experts)))
    with pytest.raises(RecipeError, match="cannot match this qwen2_moe file's routed experts") as err:
        bake_gguf(model, recipe(pruned=((0, 3, 1),)), tmp_path / "out.gguf")
    assert "\n" not in str(err.value)
    assert bake_gguf(model, recipe(pruned=((0, 4, SHARED),)), tmp_path / "shared.gguf").provenance.edited_tensors
