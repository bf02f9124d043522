"""The mixture-of-experts rows of the architecture table agree with transformers.

The table is data read from config.json without transformers (the bake stays torch-free), so each
fact it holds is compared here with what transformers itself says, for every MoE row: which layers
route (with the per-layer list transformers 5 writes, and with the older keys alone), the experts'
sizes (the parameters of the model transformers builds), the names a release stores on disk (the
checkpoint conversion mapping that save_pretrained applies) and the config keys' old spellings
(the config class's attribute_map). A new transformers that changes any of these fails here.
"""

from __future__ import annotations

import pytest
import torch

from surgery.core.architectures import ARCHITECTURES, REFUSED, Experts, architecture
from surgery.core.errors import UnsupportedArchitecture
from surgery.core.resolve import Resolver
from tests.support.installed import family_param
from tests.support.tiny import tiny_config
from tests.support.tiny_moe import RELEASE_CLASSES

MOE_ROWS = [family_param(t) for t in sorted(t for t, layout in ARCHITECTURES.items() if layout.experts)]


def _meta_model(model_type: str, config):
    """The model a release of ``model_type`` is saved from, on the meta device (no weights)."""
    import transformers

    with torch.device("meta"):
        if model_type in RELEASE_CLASSES:
            return getattr(transformers, RELEASE_CLASSES[model_type])(config)
        return transformers.AutoModelForCausalLM.from_config(config)


def _routing_layers(model, arch) -> set[int]:
    """The decoder layers where transformers built an experts module."""
    names = dict(model.named_modules())
    prefix = arch.layer_prefix(names)
    decoders = arch.geometry.num_layers // arch.layout.layers.sub_layers
    return {i for i in range(decoders) if prefix.format(layer=i) + arch.layout.experts.weights.module in names}


def _table_routing(arch) -> set[int]:
    """The decoder layers whose experts the table's layers name, each once (LongCat-Flash: one of its two
    sub-layers holds its decoder layer's experts)."""
    decoders = [arch.block(layer, "")[0] for layer in sorted(arch.geometry.sparse_layers)]
    assert len(decoders) == len(set(decoders))
    return set(decoders)


def _keys(ex: Experts) -> set[str]:
    """Every config key the row reads."""
    keys = (
        *ex.keys.num_keys,
        ex.keys.size_key,
        *((ex.shared.size_key, ex.shared.count_key) if ex.shared else ()),
        *ex.keys.dense_size_keys,
        *ex.layers.config_keys,
    )
    return {k for k in keys if k}


@pytest.mark.parametrize("model_type", MOE_ROWS)
def test_routing_layers_and_sizes_are_transformers(model_type):
    """The table's routing layers, expert count and widths (routed, shared, dense) are those of the
    model transformers builds from the same config."""
    config = tiny_config(model_type)
    arch = architecture(config.to_dict())
    g, ex = arch.geometry, arch.layout.experts
    model = _meta_model(model_type, config)
    names = dict(model.named_modules())
    prefix = arch.layer_prefix(names)
    assert _routing_layers(model, arch) == _table_routing(arch) != set()
    for layer in range(g.num_layers):
        at = arch.module_name(prefix, layer, "")
        if layer in arch.dense_mlp_layers():  # a sparse layer may keep its dense MLP too (LongCat-Flash)
            down = arch.block(layer, arch.layout.mlp.down_proj)[1]
            assert names[at + down].weight.shape == (g.hidden_size, g.intermediate_size)
        if arch.is_sparse(layer):
            experts = names[at + ex.weights.module]
            gate_up, down = experts.gate_up_proj.shape, experts.down_proj.shape
            # LongCat-Flash's zero-computation experts hold no weights; transformers before 5.25 kept
            # (unused) gate/up entries for them after the routed ones, never down ones
            assert gate_up[0] in {g.num_experts, g.num_experts + g.zero_experts}
            assert gate_up[2 if ex.weights.transposed else 1] == 2 * g.expert_size
            assert (down[0], down[1 if ex.weights.transposed else 2]) == (g.num_experts, g.expert_size)
            if shared := ex.shared:
                assert names[f"{at}{shared.module}.{shared.down}"].weight.shape == (g.hidden_size, g.shared_size)
                for m in shared.inputs:
                    assert names[f"{at}{shared.module}.{m}"].weight.shape == arch.shared_input_shape()


def _older_configs(model_type: str, config) -> list[dict]:
    """The config as an older config.json spells it: without the per-layer list of MLP kinds (or
    of routing layers), then also without the first-dense-layers key (the class's default)."""
    ex = ARCHITECTURES[model_type].experts
    cfg = config.to_dict()
    out = []
    listed = (ex.layers.layer_types_key, ex.layers.sparse_list_key)
    for drop in (listed, (*listed, ex.layers.rule.first_dense_key)):
        older = {k: v for k, v in cfg.items() if k not in drop}
        if older != cfg and older not in out:
            out.append(older)
    return out


@pytest.mark.parametrize("model_type", [p for p in MOE_ROWS if not ARCHITECTURES[p.values[0]].config.text_config_key])
def test_routing_rule_of_older_configs_is_transformers(model_type):
    """A config.json written before transformers 5 (no per-layer MLP kinds; no first-dense key):
    the table derives the routing layers as the config class does. Four layers, so that the default
    first-dense counts (1–3) and the step rules both show."""
    config = tiny_config(model_type, num_hidden_layers=4)
    for older in _older_configs(model_type, config):
        rebuilt = type(config).from_dict(older)
        arch = architecture(older)
        assert _routing_layers(_meta_model(model_type, rebuilt), arch) == _table_routing(arch), older


def _saved_names(model_type: str) -> set[str]:
    """The tensor names save_pretrained writes for a tiny model (transformers' conversion mapping
    reverted, on meta tensors)."""
    from transformers.core_model_loading import revert_weight_conversion

    model = _meta_model(model_type, tiny_config(model_type))
    return set(revert_weight_conversion(model, model.state_dict()))


@pytest.mark.parametrize("model_type", MOE_ROWS)
def test_stored_names_are_the_conversion_mappings(model_type):
    """Per-expert names (or the release's fused names) and the release's module names are those
    transformers' checkpoint conversion mapping writes: every tensor an edit resolves to exists."""
    saved = _saved_names(model_type)
    arch = architecture(tiny_config(model_type).to_dict())
    g, ex = arch.geometry, arch.layout.experts
    resolver = Resolver(arch, saved)
    first = min(g.sparse_layers)
    prefix = arch.module_name(resolver.prefix, first, "")
    stored = arch.stored_experts(saved)
    weights = ex.weights
    assert (stored is None) == (weights.per_expert is not None)  # a family splits its experts on disk, or never
    if stored is not None:
        assert stored == (weights.stored_fused or (f"{weights.module}.gate_up_proj", f"{weights.module}.down_proj"))
    for part in ("gate", "up", "down"):
        for expert in (0, g.num_experts - 1):
            for rel, *_ in arch.expert_slices(expert, part, stored is not None, stored):
                assert prefix + rel in saved
    shared = ex.shared
    edited = [f"{shared.module}.{m}" for m in (*shared.inputs, shared.down)] if shared else []
    for module in edited:
        assert resolver.stored(first, module) in saved, module
    for layer in arch.head_layers()[:1]:  # a hybrid's first attention layer
        assert resolver.stored(layer, arch.layout.attention.o_proj) in saved
    dense = [layer for layer in range(g.num_layers) if not arch.is_sparse(layer)]
    for layer in dense[:1]:
        for module in (arch.layout.mlp.down_proj, *arch.mlp_input_modules()):
            assert resolver.stored(layer, module) in saved, module


@pytest.mark.parametrize("model_type", MOE_ROWS)
def test_config_aliases_are_the_attribute_map(model_type):
    """Every old spelling transformers accepts for a key the row reads is read too, and no other."""
    config = tiny_config(model_type)
    layout = ARCHITECTURES[model_type]
    ex = layout.experts
    text = config.get_text_config() if layout.config.text_config_key else config
    attribute_map = type(text).attribute_map
    wanted = {
        (alias, key) for alias, key in attribute_map.items() if key in _keys(ex) and alias not in ex.keys.num_keys
    }
    assert set(ex.keys.aliases) == wanted


def test_an_old_spelling_stands_for_the_key():
    """Kimi-Linear's n_shared_experts (its attribute_map's alias of num_shared_experts) sizes the shared expert."""
    cfg = tiny_config("kimi_linear").to_dict()
    shared = architecture(cfg).geometry.shared_size
    cfg["n_shared_experts"] = cfg.pop("num_shared_experts")
    assert architecture(cfg).geometry.shared_size == shared


@pytest.mark.parametrize(
    "key,value,message",
    [
        (
            "mlp_layer_types",
            ["dense", "sparse"],
            "'mlp_layer_types' = \\['dense', 'sparse'\\], not a list of "
            "num_hidden_layers = 3 layer kinds; correct it or drop it",
        ),
        ("mlp_layer_types", "sparse", "not a list of num_hidden_layers = 3 layer kinds"),
    ],
)
def test_a_layer_kind_list_that_contradicts_the_layers_is_one_line(key, value, message):
    cfg = {**tiny_config("deepseek_v32").to_dict(), key: value}
    with pytest.raises(UnsupportedArchitecture, match=message):
        architecture(cfg)


def test_a_sparse_layer_list_out_of_range_is_one_line():
    cfg = {**tiny_config("llama4_text").to_dict(), "moe_layers": [1, 7]}
    with pytest.raises(UnsupportedArchitecture, match=r"'moe_layers' = \[1, 7\], not a list of layer indices in 0..2"):
        architecture(cfg)


def test_dense_layers_in_a_family_without_them_is_one_line():
    """Solar-Open has no dense MLP: a config that makes some layers dense contradicts its weights."""
    cfg = {**tiny_config("solar_open").to_dict(), "mlp_layer_types": ["dense", "sparse", "sparse"]}
    cfg = {**cfg, "n_routed_experts": 4}
    arch = architecture(cfg)  # solar_open reads no layer kinds: every layer routes
    assert arch.geometry.sparse_layers == frozenset({0, 1, 2})
    cfg = {**tiny_config("cohere2_moe").to_dict(), "intermediate_size": None, "prefix_dense_intermediate_size": None}
    with pytest.raises(UnsupportedArchitecture, match="no integer 'prefix_dense_intermediate_size'"):
        architecture(cfg)


def test_a_shared_expert_the_config_leaves_out_is_one_line():
    """Cohere2-MoE with num_shared_experts = 0 builds no shared expert: a shared-expert edit says so
    (not 'valid: 0..-1')."""
    from surgery.core.edits import SHARED, NeuronScale, Recipe
    from surgery.core.errors import RecipeError

    cfg = tiny_config("cohere2_moe", num_shared_experts=0).to_dict()
    with pytest.raises(
        RecipeError,
        match=r"^edits\[0\]\.expert = shared but cohere2_moe has no shared expert "
        r"\(config.json sets its width to 0\)$",
    ):
        Recipe((NeuronScale(1, 2, 0.0, SHARED),)).validate(cfg)


# The mixture-of-experts families refused (the other refusals: tests/core/test_coverage.py).
MOE_REFUSED = (
    "dbrx",
    "dots3_note",
    "dots3_note_text",
    "inkling2_loop_text",
    "inkling2_text",
    "inkling_text",
    "jetmoe",
)


@pytest.mark.parametrize("model_type", MOE_REFUSED)
def test_refused_families_say_why_in_one_line(model_type):
    """A causal-LM family of this transformers that surgery refuses: one line with the reason."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    assert model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in ARCHITECTURES
    with pytest.raises(UnsupportedArchitecture) as error:
        architecture({"model_type": model_type})
    assert str(error.value) == f"model_type '{model_type}' is not supported: {REFUSED[model_type]}"
    assert "\n" not in str(error.value)
