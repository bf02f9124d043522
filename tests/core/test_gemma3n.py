"""Gemma 3n's text decoder (gemma3n_text): what its row says beyond the coverage sweep's proof.

Its MLP width may differ per layer (intermediate_size is a list); its activation-sparse layers cut the
gate at mean + k·std over the neurons of each token, so a prune is the down_proj column alone; its
releases keep k_proj/v_proj tensors in the kv-shared layers that transformers does not load.
"""

from __future__ import annotations

import pytest
import torch

from surgery.core.architectures import architecture
from surgery.core.edits import HeadScale, NeuronScale
from surgery.core.errors import RecipeError, UnsupportedArchitecture
from tests.support.coverage import GEMMA3N, build_family


def _down_inputs(model, layer: int, ids: torch.Tensor) -> torch.Tensor:
    """The input of ``layer``'s down_proj (the neurons' outputs) on ``ids``."""
    seen = []
    down = model.model.layers[layer].mlp.down_proj
    handle = down.register_forward_hook(lambda _m, args, _out: seen.append(args[0].clone()))
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        handle.remove()
    return seen[0]


@pytest.mark.parametrize("layer", [0, 1])
def test_zero_input_rows_silence_a_neuron_alone_only_where_the_mlp_is_not_activation_sparse(layer):
    """Zero gate/up rows of neuron 3 leave every other neuron's output bit for bit in a layer of
    sparsity 0, but not in an activation-sparse one (the cut moves): the table's prune is therefore
    down_proj's column alone, which is exact in both."""
    model = build_family("gemma3n_text")
    sparse = model.config.activation_sparsity_pattern[layer] > 0
    ids = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(1))
    before = _down_inputs(model, layer, ids)
    with torch.no_grad():
        for name in ("gate_proj", "up_proj"):
            getattr(model.model.layers[layer].mlp, name).weight[3] = 0
    after = _down_inputs(model, layer, ids)
    others = [i for i in range(after.shape[-1]) if i != 3]
    assert bool((after[..., 3] == 0).all())
    assert torch.equal(after[..., others], before[..., others]) is not sparse

    arch = architecture(model.config.to_dict())
    (site,) = NeuronScale(layer, 3, 0.0).sites(arch)
    assert (site.module, site.axis, site.indices) == ("mlp.down_proj", "in", (3,))


def test_each_layer_has_its_own_mlp_width():
    arch = architecture(build_family("gemma3n_text").config.to_dict())
    widths = [arch.layer_edits(layer).neurons for layer in range(arch.geometry.num_layers)]
    assert widths == GEMMA3N["intermediate_size"]
    NeuronScale(1, 63, 1.5).validate(arch, "edits[0]")
    with pytest.raises(RecipeError) as exc:  # layer 1 is 64 wide, though layer 0 is 96
        NeuronScale(1, 64, 1.5).validate(arch, "edits[0]")
    assert str(exc.value) == "edits[0].neuron = 64 but the model has intermediate_size = 64 (valid: 0..63)"


@pytest.mark.parametrize("widths", [[96, 64], [96, 64, 80, 0], [96, 64.0, 80, 96]])
def test_a_width_list_that_is_not_one_per_layer_is_one_line(widths):
    config = build_family("gemma3n_text").config.to_dict()
    with pytest.raises(UnsupportedArchitecture) as exc:
        architecture({**config, "intermediate_size": widths})
    assert "'intermediate_size'" in str(exc.value) and "num_hidden_layers = 4" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_release_with_kv_projections_in_its_shared_layers_bakes_exactly(tmp_path):
    """Google's releases store k_proj/v_proj (and their norms) in the kv-shared layers, which
    transformers does not load: the bake edits around them and leaves them byte for byte."""
    from safetensors.torch import load_file, save_file

    import surgery
    from surgery.core.edits import Recipe
    from tests.support.coverage import save_family
    from tests.support.models import load_fp32, logits, stored_tensors

    model = build_family("gemma3n_text")
    src = save_family(model, tmp_path / "src")
    (weights,) = src.glob("*.safetensors")
    tensors = load_file(weights)
    shared = range(4 - model.config.num_kv_shared_layers, 4)
    extra = {
        f"model.layers.{layer}.self_attn.{name}.weight": torch.randn(
            32, 64, generator=torch.Generator().manual_seed(layer)
        )
        for layer in shared
        for name in ("k_proj", "v_proj")
    }
    save_file({**tensors, **extra}, weights, metadata={"format": "pt"})

    edits = (HeadScale(3, 1, 0.0), NeuronScale(3, 95, 0.0), NeuronScale(2, 5, 2.0))
    surgery.apply(Recipe(edits), src, tmp_path / "baked")
    after = stored_tensors(tmp_path / "baked")
    assert all(torch.equal(after[name], tensor) for name, tensor in extra.items())
    assert (logits(load_fp32(tmp_path / "baked")) - logits(model, edits)).abs().max().item() <= 1e-5
    assert surgery.verify(src, tmp_path / "baked").ok


def test_find_heads_is_refused_in_one_line_before_loading(tmp_path):
    """find-heads replays the decoder's tail after a resumed layer; Gemma 3n's AltUp tail is not in the
    table, so it is refused up front (it crashed inside the tail once), heads stay editable by name."""
    import surgery
    from tests.support.coverage import save_family

    src = save_family(build_family("gemma3n_text", num_kv_shared_layers=0), tmp_path / "src")
    with pytest.raises(
        UnsupportedArchitecture,
        match="find-heads cannot run on it: its last layer's output is a stack of AltUp streams",
    ) as exc:
        surgery.find_heads(src)
    assert "\n" not in str(exc.value) and "amplify-heads --heads" in str(exc.value)
