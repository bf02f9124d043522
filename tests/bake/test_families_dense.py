"""The dense families of issue 24, each proven on a tiny random model built from its config class.

For every case of tests/support/dense_families.py (Llama-shaped rows, ungated MLPs, fused q/k/v,
GPT-2's Conv1D, config keys spelled the family's way, checkpoints stored under renamed names):
head α and neuron edits (scaled and pruned) baked == run-time twin on fp32 logits (≤ 1e-5), exactly
the resolved tensors changed and every other byte identical, verify OK, undo byte-exact, and the
exported LoRA adapter == the bake. Then the table's data against the models themselves: the tail
find-heads runs after a resumed pass (final norm, logit scale, soft-cap) reproduces the logits,
``prune_inputs`` says whether zero MLP input rows silence a neuron alone, and the config keys,
renames and refusals agree with transformers.

Every case is a model of 2 layers, hidden size 32: the whole file runs in about 20 s on 2 cores.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from surgery.bake.bake import bake
from surgery.bake.lora import export_lora
from surgery.bake.undo import undo
from surgery.bake.verify import verify
from surgery.core.architectures import ARCHITECTURES, REFUSED, ConfigKeys, architecture
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import RecipeError, UnsupportedArchitecture
from surgery.core.resolve import Resolver
from surgery.core.sites import all_sites
from tests.support.dense_families import CASES, build_family, family_config
from tests.support.models import load_fp32, logits, stored_tensors


def _recipe(config: dict) -> Recipe:
    """Pruned and scaled neurons (the last neuron of a layer too) and, where the family has editable
    heads, two heads scaled (the last head of the last layer too)."""
    arch = architecture(config)
    g, last = arch.geometry, arch.geometry.num_layers - 1
    edits = [NeuronScale(1, 3, 0.0), NeuronScale(last, 5, 1.5), NeuronScale(0, g.intermediate_size - 1, 0.0)]
    if not arch.layout.limits.head_refusal:
        edits += [HeadScale(0, 1, 2.5), HeadScale(last, g.num_heads - 1, 0.5)]
    return Recipe(tuple(edits))


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))  # bytes: -0.0 ≠ +0.0


@pytest.mark.parametrize("case", list(CASES))
def test_family_bake_twin_verify_undo_lora(case, tmp_path):
    from peft import PeftModel

    src = build_family(case, tmp_path / "src")
    ckpt = Checkpoint(src)
    arch, recipe = architecture(ckpt.config), _recipe(ckpt.config)
    dst = tmp_path / "baked"
    bake(ckpt, recipe, dst)

    model = load_fp32(src)
    base, twin, baked = logits(model), logits(model, recipe.edits), logits(load_fp32(dst))
    assert (base - twin).abs().max().item() > 1e-3  # the recipe does something
    assert (twin - baked).abs().max().item() <= 1e-5

    # exactly the tensors the sites resolve to changed (biases of pruned rows too); the rest is a copy
    before, after = stored_tensors(src), stored_tensors(dst)
    resolved = {sl.tensor for sl in Resolver(arch, ckpt.tensors).all(all_sites(arch, recipe.active()))}
    assert before.keys() == after.keys() and resolved <= before.keys()
    assert {n for n in before if not _equal(before[n], after[n])} == resolved
    assert (src / "config.json").read_bytes() == (dst / "config.json").read_bytes()

    report = verify(ckpt, dst, model=model)
    assert report.ok, report.problems
    undo(dst, tmp_path / "restored")
    for f in src.iterdir():
        assert file_sha256(f) == file_sha256(tmp_path / "restored" / f.name), f.name

    export_lora(ckpt, recipe, tmp_path / "adapter")
    adapted = logits(PeftModel.from_pretrained(model, tmp_path / "adapter").eval())
    assert (adapted - baked).abs().max().item() <= 1e-5


def test_conv1d_sites_are_stored_rows(tmp_path):
    """GPT-2 stores c_proj [in, out]: a head's o-projection columns are rows of the stored tensor."""
    src = build_family("gpt2", tmp_path / "gpt2")
    ckpt = Checkpoint(src)
    arch = architecture(ckpt.config)
    d = arch.geometry.head_dim
    (weight,) = Resolver(arch, ckpt.tensors).slices(HeadScale(1, 2, 3.0).sites(arch)[0])
    assert (weight.tensor, weight.as_rows, weight.lines) == (
        "transformer.h.1.attn.c_proj.weight",
        True,
        tuple(range(2 * d, 3 * d)),
    )
    bake(ckpt, Recipe((HeadScale(1, 2, 3.0),)), tmp_path / "baked")
    before = stored_tensors(src)["transformer.h.1.attn.c_proj.weight"]
    after = stored_tensors(tmp_path / "baked")["transformer.h.1.attn.c_proj.weight"]
    assert torch.equal(after[2 * d : 3 * d], before[2 * d : 3 * d] * 3.0)
    assert torch.equal(after[: 2 * d], before[: 2 * d]) and torch.equal(after[3 * d :], before[3 * d :])


# --- the table's data against the models ---------------------------------------------------------


def _model(case: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(family_config(case)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_tail_reproduces_the_logits(case):
    """find-heads' resumed passes end with the table's tail (final norm, lm_head, logit multiplier,
    divisor, soft-cap): on the last decoder layer's output it gives the model's own logits."""
    from surgery.find.heads.resume import tail_logits
    from surgery.model.hooks import decoder_layers

    model = _model(case)
    seen = []
    decoder_layers(model)[-1].register_forward_hook(
        lambda m, a, out: seen.append(out[0] if isinstance(out, (tuple, list)) else out)
    )
    ids = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(input_ids=ids).logits[:, -1]
        assert (tail_logits(model, seen[0]) - full).abs().max().item() <= 1e-5


def _down_inputs(model, arch, layer: int, ids: torch.Tensor) -> torch.Tensor:
    from surgery.model.hooks import layer_module

    seen = []
    handle = layer_module(model, arch, layer, arch.layout.mlp.down_proj).register_forward_pre_hook(
        lambda m, args: seen.append(args[0])
    )
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        handle.remove()
    return seen[0]


@pytest.mark.parametrize("case", sorted({t: c for c, (t, _) in reversed(CASES.items())}.values()))
def test_prune_inputs_says_whether_zero_input_rows_silence_a_neuron(case):
    """Zero input rows (and biases) of neuron i make its down_proj input exactly 0 and leave every
    other neuron's bit for bit, where the table zeroes them (prune_inputs); where it does not (xIELU:
    act(0) ≠ 0; BitNet: a norm over the hidden units), they would not."""
    from surgery.model.hooks import layer_module, model_architecture

    model = _model(case)
    arch = model_architecture(model)
    ids = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(1))
    neuron, layer = 3, 1
    before = _down_inputs(model, arch, layer, ids)
    with torch.no_grad():
        for name in arch.mlp_input_modules():
            module = layer_module(model, arch, layer, name)
            rows = list(arch.neuron_rows(name, neuron))
            weight = module.weight.T if arch.stored_flipped(name) else module.weight
            weight[rows] = 0
            if getattr(module, "bias", None) is not None:
                module.bias[rows] = 0
    after = _down_inputs(model, arch, layer, ids)
    others = [i for i in range(after.shape[-1]) if i != neuron]
    silenced = bool((after[..., neuron] == 0).all()) and torch.equal(after[..., others], before[..., others])
    assert silenced == arch.layout.mlp.prune_inputs


def test_heads_refused_in_one_line():
    config = family_config("diffllama").to_dict()
    with pytest.raises(
        RecipeError,
        match=r"^edits\[0\]: diffllama has no head edits: differential "
        r"attention .*; edit its MLP neurons instead$",
    ):
        Recipe((HeadScale(0, 1, 2.0),)).validate(config)


_NAMES = tuple(f.name for f in dataclasses.fields(ConfigKeys) if f.name not in ("mlp_ratio", "kv_heads_when"))


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_config_keys_are_the_config_class_names(model_type):
    """Where a config class maps a transformers name to its own key (attribute_map), the table's key
    is that key; every key the table reads is one the config class writes to config.json."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    layout = ARCHITECTURES[model_type]
    cls = CONFIG_MAPPING[model_type]
    keys = layout.config.keys
    for name in _NAMES:
        if name in cls.attribute_map:
            assert getattr(keys, name) == cls.attribute_map[name], (model_type, name)
    cases = [c for c, (t, _) in CASES.items() if t == model_type]
    if cases:  # the dense rows: a tiny config of the family holds every key the table reads
        written = family_config(cases[0]).to_dict()
        written = written.get(layout.config.text_config_key, written) if layout.config.text_config_key else written
        read = (
            [getattr(keys, n) for n in _NAMES if getattr(keys, n)]
            + [k for k in (keys.mlp_ratio,) if isinstance(k, str)]
            + [f for f, _ in keys.kv_heads_when]
        )
        assert not [k for k in read if k not in written], model_type


@pytest.mark.parametrize("model_type", sorted(t for t, layout in ARCHITECTURES.items() if layout.names.renames))
def test_renames_are_transformers_conversion_mapping(model_type):
    """A row's on-disk renames are transformers' own checkpoint conversion renames, in order."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightRenaming

    mapping = get_checkpoint_conversion_mapping(model_type)
    assert all(isinstance(m, WeightRenaming) for m in mapping)
    assert ARCHITECTURES[model_type].names.renames == tuple(
        (m.source_patterns[0], m.target_patterns[0]) for m in mapping
    )


def test_stray_keys_are_not_read():
    """A GPT-2 config.json that also holds transformers' standard names (left by a conversion
    script, or by a config built with them) is read through GPT-2's own keys."""
    config = family_config("gpt2").to_dict()
    assert config["intermediate_size"] and config["num_key_value_heads"] == 1 and config["head_dim"]
    g = architecture(config).geometry
    assert (g.num_layers, g.num_heads, g.num_kv_heads, g.head_dim, g.hidden_size, g.intermediate_size) == (
        config["n_layer"],
        config["n_head"],
        config["n_head"],
        config["n_embd"] // config["n_head"],
        config["n_embd"],
        4 * config["n_embd"],
    )


@pytest.mark.parametrize("model_type", ["hrm_text", "dory", "blt"])
def test_refused_families_say_why_in_one_line(model_type):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    assert model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in ARCHITECTURES
    config = CONFIG_MAPPING[model_type]().to_dict()
    with pytest.raises(UnsupportedArchitecture) as err:
        architecture(config)
    assert str(err.value) == f"model_type '{model_type}' is not supported: {REFUSED[model_type]}"
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "case,key,value,words",
    [
        (
            "gpt2",
            "n_embd",
            64,
            (
                "'transformer.h.0.attn.c_proj.weight' has shape [32, 32], expected [64, 64]",
                "(n_head × (n_embd / n_head) = 4 × 16 rows)",
            ),
        ),  # Conv1D: its input side is rows
        (
            "falcon-mha",
            "multi_query",
            True,
            (
                "'transformer.h.0.self_attention.query_key_value.weight' has shape [96, 32]",
                "k/v heads (set by new_decoder_architecture, multi_query)",
            ),
        ),
    ],
)
def test_a_config_contradicting_its_tensors_names_the_family_keys(tmp_path, case, key, value, words):
    """One line naming the family's own config keys (GPT-2's n_embd, Falcon's flags), nothing written."""
    import json

    from surgery.core.errors import CheckpointError

    src = build_family(case, tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, key: value}))
    with pytest.raises(CheckpointError) as err:
        bake(Checkpoint(src), Recipe((NeuronScale(0, 1, 0.0),)), tmp_path / "out")
    assert all(w in str(err.value) for w in words) and "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "case,stored",
    [
        ("gpt2", "h.0.attn.c_proj.weight"),
        ("bloom", "h.0.self_attention.dense.weight"),
        ("opt", "decoder.layers.0.self_attn.out_proj.weight"),
    ],
)
def test_checkpoints_saved_from_the_base_model(tmp_path, case, stored):
    """The Hub's gpt2, bloom and opt checkpoints hold the base model's names (no "transformer." or
    "model." prefix); transformers adds it on load. The bake edits them under their own names."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(family_config(case, tie_word_embeddings=True))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.base_model.save_pretrained(tmp_path / "src")  # e.g. GPT2Model: h.0.…, wte.weight
    ckpt = Checkpoint(tmp_path / "src")
    assert stored in ckpt.tensors
    recipe = _recipe(ckpt.config)
    bake(ckpt, recipe, tmp_path / "baked")
    before, after = stored_tensors(tmp_path / "src"), stored_tensors(tmp_path / "baked")
    assert not _equal(before[stored], after[stored])  # head 1 of layer 0 is scaled
    report = verify(ckpt, tmp_path / "baked")
    assert report.ok, report.problems


def test_apertus1p5_text_prefixes_are_transformers_conversion():
    """Apertus 1.5's text layers stored under model.language_model. load as model.layers.: each prefix
    spelling of the row is one transformers' conversion mapping reads as the loaded one."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    (change,) = get_checkpoint_conversion_mapping("apertus1p5_text")
    loaded, *stored = ARCHITECTURES["apertus1p5_text"].names.layer_prefixes
    for prefix in stored:
        name = f"{prefix.format(layer=3)}self_attn.o_proj.weight"
        assert change.rename_source_key(name)[0] == f"{loaded.format(layer=3)}self_attn.o_proj.weight"


def test_apertus1p5_text_stored_under_language_model(tmp_path):
    """A checkpoint holding the text layers as model.language_model.layers.N (the multimodal
    release's names) is baked under those names and verifies (transformers renames them on load)."""
    from safetensors.torch import load_file, save_file

    src = build_family("apertus1p5_text", tmp_path / "src")
    tensors = load_file(src / "model.safetensors")
    save_file(
        {k.replace("model.layers.", "model.language_model.layers."): v for k, v in tensors.items()},
        str(src / "model.safetensors"),
        metadata={"format": "pt"},
    )
    ckpt = Checkpoint(src)
    recipe = _recipe(ckpt.config)
    bake(ckpt, recipe, tmp_path / "baked")
    after = stored_tensors(tmp_path / "baked")
    assert "model.language_model.layers.0.self_attn.o_proj.weight" in after
    report = verify(ckpt, tmp_path / "baked")
    assert report.ok, report.problems
