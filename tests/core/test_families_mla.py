"""The table's MLA, DeepSeek-V4 and hybrid-layer data: what it reads from config.json agrees with what
transformers makes of the same config, its stored names with transformers' checkpoint conversion
mapping; the sites it gives; per-layer refusals and contradicting configs in one line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from surgery.core import architectures
from surgery.core.architectures import ARCHITECTURES, ATTENTION_KINDS, LEGACY_KINDS, architecture
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import CheckpointError, RecipeError, UnsupportedArchitecture
from surgery.core.resolve import Resolver
from surgery.core.sites import sites
from tests.support.families import MLA, family_config


def _arch(model_type: str, **overrides):
    return architecture(family_config(model_type, **overrides).to_dict())


def _legacy(model_type: str, drop: tuple[str, ...], **keys) -> dict:
    """A config.json as an older release writes it: ``drop`` left out, ``keys`` set."""
    cfg = {k: v for k, v in family_config(model_type).to_dict().items() if k not in drop}
    return {**cfg, **keys}


def _config_class(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


# --- what a layer is: the table's rules against transformers' config classes -------------------------


def test_legacy_kind_names_are_transformers():
    from transformers import configuration_utils as cu

    assert LEGACY_KINDS == cu._LEGACY_LAYER_TYPE_REMAP
    assert set(ATTENTION_KINDS) <= set(cu.ALLOWED_ATTN_LAYER_TYPES)


# Per-layer lists whose length must follow num_hidden_layers (Bailing-hybrid's SwiGLU clipping limits since
# transformers 5.25): left out where a rule changes the layer count, as releases before them do.
_PER_LAYER_LIMITS = ("expert_swiglu_limit_list", "share_expert_swiglu_limit_list")

# (model type, keys config.json lacks, keys it has instead): each rule form of the table once
ATTENTION_RULES = [
    ("qwen3_next", ("layer_types",), dict(full_attention_interval=3, num_hidden_layers=6)),  # interval
    ("qwen3_5_text", ("layer_types",), dict(full_attention_interval=2)),
    (
        "bailing_hybrid",
        ("layer_types", "mlp_layer_types", *_PER_LAYER_LIMITS),
        dict(layer_group_size=3, num_hidden_layers=6, first_k_dense_replace=1),
    ),
    ("jamba", (), dict(attn_layer_period=3, attn_layer_offset=1, num_hidden_layers=6)),  # period
    ("bamba", (), dict(attn_layer_indices=[1, 4], num_hidden_layers=6)),  # indices
    ("bamba", (), dict(attn_layer_indices=None)),  # null: none
    ("lfm2", ("layer_types",), dict(full_attn_idxs=[0, 3], num_hidden_layers=5)),
    (
        "kimi_linear",
        ("layer_types", "mlp_layer_types"),
        dict(  # 1-based
            num_hidden_layers=6,
            first_k_dense_replace=1,
            linear_attn_config={"full_attn_layers": [2, 4], "kda_layers": [1, 3, 5, 6]},
        ),
    ),
    ("nemotron_h", ("layers_block_type", "num_hidden_layers"), dict(hybrid_override_pattern="M*-M*E")),  # pattern
    ("recurrent_gemma", (), dict(block_types=["recurrent", "recurrent", "attention"], num_hidden_layers=7)),
    ("olmo_hybrid", (), dict(layer_types=["linear_attention", "full_attention"] * 2)),  # list
]


@pytest.mark.parametrize(
    "model_type,drop,keys", ATTENTION_RULES, ids=[f"{c[0]}-{sorted(c[2])[0]}" for c in ATTENTION_RULES]
)
def test_layer_kinds_are_transformers_layer_types(model_type, drop, keys):
    from transformers.configuration_utils import remap_legacy_layer_types

    raw = _legacy(model_type, drop, **keys)
    theirs = remap_legacy_layer_types(list(_config_class(model_type)(**raw).layer_types))
    arch = architecture(raw)
    assert list(arch.geometry.layer_kinds) == theirs and arch.geometry.num_layers == len(theirs)
    assert arch.head_layers() == tuple(i for i, k in enumerate(theirs) if k in arch.layout.layers.layer_kinds.editable)


MLP_RULES = [
    ("deepseek_v32", ("mlp_layer_types", "layer_types"), dict(first_k_dense_replace=2, num_hidden_layers=5)),
    (
        "kimi_linear",
        ("mlp_layer_types",),
        dict(first_k_dense_replace=2, num_hidden_layers=6, layer_types=["full_attention"] * 6),
    ),
    (
        "bailing_hybrid",
        ("mlp_layer_types", *_PER_LAYER_LIMITS),
        dict(first_k_dense_replace=1, num_hidden_layers=6, layer_types=["full_attention"] * 6),
    ),
    ("nemotron_h", ("layers_block_type", "num_hidden_layers"), dict(hybrid_override_pattern="M*-M*E")),
]


@pytest.mark.parametrize("model_type,drop,keys", MLP_RULES, ids=[c[0] for c in MLP_RULES])
def test_mlp_kinds_are_transformers_mlp_layer_types(model_type, drop, keys):
    raw = _legacy(model_type, drop, **keys)
    config = _config_class(model_type)(**raw)
    theirs = getattr(config, "mlp_layer_types", None) or config.layer_types
    arch = architecture(raw)
    # a row with experts: its routing rule says which layers are sparse (the others dense)
    ours = arch.geometry.mlp_kinds or ["sparse" if arch.is_sparse(i) else "dense" for i in range(len(theirs))]
    assert list(ours) == list(theirs)


@pytest.mark.parametrize("model_type", ["deepseek_v2", "deepseek_v3", "sarvam_mla", "jamba"])
def test_dense_layers_are_where_the_model_builds_a_dense_mlp(model_type):
    """Types whose config class has no per-layer list: the model built on the meta device decides."""
    import torch
    from transformers import AutoModelForCausalLM

    keys = (
        dict(expert_layer_period=2, expert_layer_offset=1, num_experts=2)
        if model_type == "jamba"
        else dict(first_k_dense_replace=2)
    )
    config = family_config(model_type, **keys)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    arch = architecture(config.to_dict())
    mlp = "feed_forward" if model_type == "jamba" else "mlp"
    built = tuple(i for i, layer in enumerate(model.model.layers) if not hasattr(getattr(layer, mlp), "experts"))
    assert arch.dense_mlp_layers() == built and 0 < len(built) < arch.geometry.num_layers


@pytest.mark.parametrize("model_type", ["lfm2", "recurrent_gemma"])
def test_a_derived_mlp_width_is_the_built_models(model_type):
    import torch
    from transformers import AutoModelForCausalLM

    config = family_config(model_type, intermediate_size=96)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    arch = architecture(config.to_dict())
    down = dict(model.named_modules())[f"model.layers.0.{arch.layout.mlp.down_proj}"]
    assert down.in_features == arch.geometry.intermediate_size != 96


# --- stored names: transformers' conversion mapping loads each of them as the table's module -------------

STORED = [t for t, row in ARCHITECTURES.items() if row.names.stored_names or len(row.names.layer_prefixes) > 1]
STORED = [t for t in STORED if t in {"deepseek_v4", "hy_v4", "bailing_hybrid", "kimi_linear", "nemotron_h"}]


@pytest.mark.parametrize("model_type", STORED)
def test_stored_names_load_as_the_tables_modules(model_type):
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    config = family_config(model_type)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    arch = architecture(config.to_dict())
    mapping = get_model_conversion_mapping(model)
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    modules = {m for m in dict(model.named_modules())}
    layer = arch.head_layers()[-1]
    edited = [arch.layout.attention.o_proj, *(m for m in (arch.layout.mlp.down_proj, arch.layout.mlp.gate_proj) if m)]
    for prefix in arch.layout.names.layer_prefixes:
        for module in edited:
            if f"model.layers.{layer}.{module}" not in modules:
                continue  # DeepSeek-V4 has no dense MLP
            stored = f"{prefix.format(layer=layer)}{arch.stored_module(module)}.weight"
            loaded, _ = rename_source_key(stored, renamings, converters)
            assert loaded.removeprefix("model.") == f"layers.{layer}.{module}.weight", (stored, loaded)


def test_the_table_has_each_model_type_once():
    """Rows added by several helpers at once: a second literal key, in one group's table or in two
    groups (table_*.py, joined into ARCHITECTURES), would silently replace the first."""
    keys = []
    for path in sorted(Path(architectures.__file__).parent.glob("table_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict) and node.keys and all(isinstance(k, ast.Constant) for k in node.keys):
                if all(isinstance(v, (ast.Call, ast.Name, ast.Subscript)) for v in node.values):  # rows
                    keys += [k.value for k in node.keys]
            elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
                keys.append(node.targets[0].slice.value)  # TABLE["alias"] = …
    assert len(keys) == len(set(keys)), sorted({k for k in keys if keys.count(k) > 1})
    assert set(keys) == set(architectures.ARCHITECTURES)  # every row is seen by this test
    assert not set(keys) & set(architectures.REFUSED)


# --- sites: an MLA head is v_head_dim columns; a DeepSeek-V4 head a block within its group's rows ----


def test_mla_head_is_v_head_dim_columns_and_shapes_follow_the_ranks():
    arch = _arch("deepseek_v3")
    v, qk, heads = MLA["v_head_dim"], MLA["qk_nope_head_dim"] + MLA["qk_rope_head_dim"], 4
    (site,) = sites(arch, HeadScale(1, 2, 0.5))
    assert site.indices == tuple(range(2 * v, 3 * v)) and site.shape == (32, heads * v) and site.group is None
    shapes = {m: shape for m, (shape, _) in arch.attention_shapes().items()}
    assert shapes == {
        "self_attn.o_proj": (32, heads * v),
        "self_attn.q_a_proj": (16, 32),
        "self_attn.q_b_proj": (heads * qk, 16),
        "self_attn.kv_a_proj_with_mqa": (8 + 4, 32),
        "self_attn.kv_b_proj": (heads * (MLA["qk_nope_head_dim"] + v), 8),
    }
    plain_q = {m for m in _arch("bailing_hybrid").attention_shapes()}  # q_lora_rank null: one q_proj
    assert "self_attn.q_proj" in plain_q and "self_attn.q_b_proj" not in plain_q


def test_deepseek_v4_head_is_its_columns_within_its_groups_rows():
    from surgery.model.hooks import scale_vectors

    arch = _arch("deepseek_v4")  # 4 heads of 8 in 2 groups, o_lora_rank 6: o_a_proj is (12, 16)
    (site,) = sites(arch, HeadScale(2, 3, 0.5))
    assert site.module == "self_attn.o_a_proj" and site.shape == (12, 16)
    assert site.indices == tuple(range(8, 16)) and site.group == (1, 2) and site.rows == (6, 6)
    names = [f"model.layers.{i}.attn.wo_a.weight" for i in range(4)]
    (sl,) = Resolver(arch, names).slices(site)
    assert (sl.tensor, sl.first_row, sl.window, sl.lines) == (names[2], 6, 6, site.indices)
    vector = scale_vectors(arch, [HeadScale(2, 3, 0.5)])[("self_attn.o_a_proj", 2)]
    assert vector.shape == (2, 16) and vector[1, 8:].eq(0.5).all() and vector[0].eq(1).all()


# --- per layer: heads where softmax attention is, neurons where a dense MLP is ----------------------


def test_a_head_in_a_linear_attention_layer_is_refused_naming_layer_and_kind():
    arch = _arch("qwen3_5_text")
    HeadScale(1, 0, 2.0).validate(arch, "edits[0]")
    with pytest.raises(RecipeError) as exc:
        HeadScale(2, 0, 2.0).validate(arch, "edits[0]")
    msg = str(exc.value)
    assert "\n" not in msg and "layer = 2 is a linear_attention layer" in msg and "layers: 1, 3" in msg


def test_neurons_only_where_a_dense_mlp_is():
    arch = _arch("nemotron_h")  # mamba, attention, MLP, attention
    NeuronScale(2, 5, 0.0).validate(arch, "edits[0]")
    for layer, kind in ((0, "linear_attention"), (1, "full_attention")):
        with pytest.raises(RecipeError, match=f"layer = {layer} is a '{kind}' layer .* no dense MLP .* layers 2\\)"):
            NeuronScale(layer, 5, 0.0).validate(arch, "edits[0]")
    with pytest.raises(RecipeError, match="layer = 2 is a mlp layer .* no attention heads"):
        HeadScale(2, 0, 2.0).validate(arch, "edits[0]")


def test_a_sparse_layer_without_experts_in_the_table_is_refused():
    arch = _arch("hy_v4", mlp_layer_types=["dense", "sparse", "dense", "dense"])  # its row has no experts
    NeuronScale(0, 5, 0.0).validate(arch, "edits[0]")
    with pytest.raises(RecipeError, match="layer = 1 is a 'sparse' layer .* no dense MLP"):
        NeuronScale(1, 5, 0.0).validate(arch, "edits[0]")
    with pytest.raises(RecipeError, match="does not edit the experts of this hy_v4 model"):
        NeuronScale(1, 5, 0.0, 0).validate(arch, "edits[0]")


def test_a_refused_edit_writes_nothing(tmp_path):
    import surgery
    from tests.support.families import build_family

    src = build_family("qwen3_5_text", tmp_path / "src")
    with pytest.raises(RecipeError, match="linear_attention"):
        surgery.apply(Recipe((HeadScale(0, 1, 2.0),)), src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --- configs that are not what the table needs: one line each --------------------------------------


def test_contradicting_or_missing_layer_kinds_are_one_line():
    raw = family_config("olmo_hybrid").to_dict()
    with pytest.raises(UnsupportedArchitecture, match="'layer_types' has 3 entries but num_hidden_layers = 4"):
        architecture({**raw, "layer_types": ["full_attention"] * 3})
    with pytest.raises(UnsupportedArchitecture, match="has no 'layer_types' .* complete transformers config"):
        architecture({k: v for k, v in raw.items() if k != "layer_types"})
    v4 = family_config("deepseek_v4").to_dict()
    with pytest.raises(UnsupportedArchitecture, match="num_attention_heads = 4 is not a multiple of o_groups = 3"):
        architecture({**v4, "o_groups": 3})


def test_a_config_whose_mla_sizes_contradict_the_tensors_is_one_line(tmp_path):
    import json

    import surgery
    from tests.support.families import build_family

    src = build_family("minicpm3", tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "v_head_dim": 5}))
    with pytest.raises(CheckpointError, match=r"num_attention_heads × v_head_dim = 4 × 5 columns"):
        surgery.apply(Recipe((HeadScale(0, 1, 2.0),)), src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model_type", sorted(architectures.REFUSED))
def test_refused_types_say_why_in_one_line(model_type):
    with pytest.raises(UnsupportedArchitecture) as exc:
        architecture({"model_type": model_type})
    assert str(exc.value) == f"model_type '{model_type}' is not supported: {architectures.REFUSED[model_type]}"


def test_inspect_says_what_each_kind_of_layer_allows(tmp_path):
    import surgery
    from tests.support.families import build_family

    info = surgery.inspect(build_family("nemotron_h", tmp_path / "src"))
    ssm = "heads of linear attention or a state-space scan (only softmax-attention heads are edited)"
    assert list(info.layer_kinds) == [
        {
            "layers": [0],
            "kind": "linear_attention",
            "refused": [ssm],
            "writers": ["mixer.out_proj"],  # the Mamba block's output: a direction edit projects it
            "summary": f"layers 0 (linear_attention): nothing; refused: {ssm}; residual writers: mixer.out_proj",
        },
        {
            "layers": [1, 3],
            "kind": "full_attention",
            "heads": 4,
            "writers": ["mixer.o_proj"],
            "summary": "layers 1, 3 (full_attention): 4 heads; residual writers: mixer.o_proj",
        },
        {
            "layers": [2],
            "kind": "mlp",
            "neurons": 48,
            "writers": ["mixer.down_proj"],
            "summary": "layers 2 (mlp): 48 MLP neurons; residual writers: mixer.down_proj",
        },
    ]
    info = surgery.inspect(build_family("deepseek_v4", tmp_path / "v4"))
    assert (info.o_groups, info.o_lora_rank) == (2, 6)
    experts = "experts (this table row does not describe its mixture of experts)"
    assert [k["summary"] for k in info.layer_kinds] == [
        f"layers 0 (hash_moe): 4 heads; refused: {experts}; residual writers: self_attn.o_b_proj",
        f"layers 1–3 (moe): 4 heads; refused: {experts}; residual writers: self_attn.o_b_proj",
    ]
