"""LongCat-Flash: each decoder layer holds two attention blocks and two dense MLPs (ModuleLists self_attn,
mlps) and a shortcut mixture of experts with zero-computation experts. The table's layers are the
sub-layers, numbered as transformers numbers their attention; these tests pin that numbering, where
each kind of edit lands, and the one-line refusals (zero-computation experts, the finders). The
family's proof of every edit kind is the coverage sweep's (tests/core/test_coverage.py -k longcat)."""

from __future__ import annotations

import pytest
import torch

from surgery.core.architectures import architecture
from surgery.core.edits import HeadScale, NeuronScale
from surgery.core.errors import RecipeError, UnsupportedArchitecture
from surgery.core.resolve import Resolver
from surgery.core.sites import sites, where_text
from tests.support.tiny import tiny_config

# the tiny config: 2 decoder layers (4 sub-layers), 4 heads of v_head_dim 8, MLPs 48 wide,
# 4 routed experts 16 wide and 2 zero-computation experts (tests/support/tiny_moe.py)
CONFIG = tiny_config("longcat_flash")


def _names(arch) -> list[str]:
    """The tensor names save_pretrained writes for the tiny model (per-expert experts)."""
    from transformers import AutoModelForCausalLM
    from transformers.core_model_loading import revert_weight_conversion

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(CONFIG)
    return list(revert_weight_conversion(model, model.state_dict()))


def test_the_layers_are_the_sub_layers_numbered_as_transformers_numbers_attention():
    """Table layer 2L + i is block i of decoder layer L: its attention module's layer_idx (the cache
    index transformers gives it) is the table's layer; the experts are read in the first block."""
    from transformers import AutoModelForCausalLM

    arch = architecture(CONFIG.to_dict())
    g = arch.geometry
    assert (g.num_layers, g.head_dim, g.num_experts, g.zero_experts) == (4, 8, 4, 2)
    assert g.sparse_layers == {0, 2} and arch.dense_mlp_layers() == (0, 1, 2, 3)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(CONFIG)
    names = dict(model.named_modules())
    prefix = arch.layer_prefix(names)
    for layer in arch.head_layers():
        assert names[arch.module_name(prefix, layer, "self_attn.{sub}")].layer_idx == layer
    edits = {layer: arch.layer_edits(layer).text() for layer in range(4)}
    writers = "residual writers: self_attn.{0}.o_proj, mlps.{0}.down_proj"  # block 0 or 1 of its decoder layer
    assert (
        edits[0]
        == edits[2]
        == f"4 heads; 48 MLP neurons; 4 experts × 16 neurons; {writers.format(0)}, mlp.experts.down_proj"
    )
    assert edits[1] == edits[3] == f"4 heads; 48 MLP neurons; {writers.format(1)}"


def test_each_edit_resolves_to_its_blocks_tensors():
    arch = architecture(CONFIG.to_dict())
    resolver = Resolver(arch, _names(arch))

    def tensors(edit) -> list[str]:
        return [sl.tensor for sl in resolver.all(sites(arch, edit))]

    assert tensors(HeadScale(3, 1, 0.5)) == ["model.layers.1.self_attn.1.o_proj.weight"]
    assert where_text(arch, HeadScale(3, 1, 0.5)) == "`self_attn.1.o_proj` columns 8–15"
    assert tensors(NeuronScale(2, 5, 0.0)) == [
        "model.layers.1.mlps.0.down_proj.weight",
        "model.layers.1.mlps.0.gate_proj.weight",
        "model.layers.1.mlps.0.up_proj.weight",
    ]
    assert tensors(NeuronScale(2, 5, 0.0, 3)) == [
        f"model.layers.1.mlp.experts.3.{m}_proj.weight" for m in ("down", "gate", "up")
    ]
    with pytest.raises(RecipeError, match=r"^edits\[0\]\.expert = 0 but layer 1 is a dense MLP \(no experts\)"):
        NeuronScale(1, 5, 0.0, 0).validate(arch, "edits[0]")


def test_a_zero_computation_expert_is_refused_in_one_line():
    arch = architecture(CONFIG.to_dict())
    for expert in (4, 5):  # after the 4 routed experts: weightless identity experts
        with pytest.raises(RecipeError) as exc:
            NeuronScale(0, 1, 0.0, expert).validate(arch, "edits[0]")
        assert str(exc.value) == (
            f"edits[0].expert = {expert} is one of longcat_flash's zero-computation experts (zero_expert_num = 2, "
            "after the 4 routed ones): it passes its input through and has no weights to edit; name a routed "
            "expert (0..3)"
        )
    with pytest.raises(RecipeError, match=r"the model has 4 experts per layer \(valid: 0\.\.3\)$"):
        NeuronScale(0, 1, 0.0, 6).validate(arch, "edits[0]")


def test_the_finders_refuse_it_in_one_line(tmp_path):
    """Their passes read and resume whole decoder layers: each finder is one line before any loading."""
    from surgery.core.checkpoint import Checkpoint
    from surgery.find.directions.find import find_direction
    from surgery.find.heads.find import check_observable
    from surgery.find.neurons.find import find_neurons
    from tests.support.coverage import build_family, save_family

    ckpt = Checkpoint(save_family(build_family("longcat_flash"), tmp_path / "src"))
    calls = {
        "find-heads": lambda: check_observable(architecture(ckpt.config)),
        "find-neurons": lambda: find_neurons(ckpt, None),
        "find-direction": lambda: find_direction(ckpt, None, None),
    }
    for finder, call in calls.items():
        with pytest.raises(UnsupportedArchitecture) as exc:
            call()
        message = str(exc.value)
        assert message.startswith(f"longcat_flash: {finder} cannot run on it: each decoder layer runs two attention")
        assert "\n" not in message and "instead" in message
