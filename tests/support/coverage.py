"""The coverage sweep's tiny random model of any causal-LM model type, built from its own config class (no network).

One generic rule makes a config tiny: every size below that the config class declares (a dataclass
field, or a standard name its ``attribute_map`` translates, e.g. gpt2's ``n_embd`` for
``hidden_size``) is set; the config's own ``__post_init__`` then derives the rest (per-layer type
lists, defaults such as ``n_inner = 4 × n_embd``). Sub-configs (a wrapper's ``text_config``, its
vision or audio tower) are made tiny the same way, the towers smaller still. ``OVERRIDES`` holds
the few per-type settings that the rule cannot know, as data (a sub-config's by its model type).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from tests.support.dense_families import CASES as DENSE_CASES
from tests.support.dense_families import family_config
from tests.support.families import FAMILIES, SMALL
from tests.support.tiny_moe import FAMILIES as MOE_FAMILIES
from tests.support.tiny_moe import tiny_moe_config

# hidden 64, 4 layers (a dense layer and expert layers, full and sliding attention both occur),
# 4 heads over 2 kv heads (GQA) of head_dim 16, vocab 128; experts: 4 of width 32, top-2.
SIZES: dict[str, Any] = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    sliding_window=8,
    num_experts=4,
    num_local_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
    n_shared_experts=1,
    first_k_dense_replace=1,
    q_lora_rank=32,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=12,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)
# A vision or audio tower: one small layer (it is only carried along, byte for byte).
TOWER: dict[str, Any] = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=1,
    depth=1,
    num_attention_heads=2,
    num_heads=2,
    embed_dim=32,
    image_size=28,
    patch_size=14,
    out_hidden_size=64,
    projection_dim=32,
    num_blocks=1,
    ext_pw_out_channel=32,
    depthwise_separable_out_channel=32,
    nemo_conv_channels=32,
    mm_embed_dim=32,
    mm_posemb_size=16,
    output_proj_dims=32,
)
TEXT_KEYS = ("text_config",)
# Towers a wrapper's default config leaves out, which its releases have (the proof wants them there).
TOWERS: dict[str, tuple[str, ...]] = {"gemma4": ("vision_config",), "gemma4_unified": ("vision_config",)}
# Settings the generic rule cannot derive, per model type (merged over the sizes above).
# Gemma 4: its full-attention layers' own head size and kv heads, values from keys there, a kv-shared
# last layer with a double-wide MLP, and small per-layer inputs.
GEMMA4 = dict(
    global_head_dim=32,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    num_kv_shared_layers=1,
    use_double_wide_mlp=True,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=128,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
)
# Gemma 3n: MLP widths that differ per layer, activation-sparse MLPs in the first and last layers
# (the proof's neuron edits land in them), two kv-shared layers, small per-layer inputs and laurel.
GEMMA3N = dict(
    intermediate_size=[96, 64, 80, 96],
    activation_sparsity_pattern=[0.5, 0.0, 0.0, 0.5],
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    num_kv_shared_layers=2,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=128,
    laurel_rank=8,
)
# The MLA, DeepSeek-V4 and hybrid families: their own tiny settings (tests/support/families.py: MLA
# ranks and head sizes that all differ, layer kinds that mix attention and the other kinds).
OVERRIDES: dict[str, dict[str, Any]] = {
    **{model_type: {**SMALL, **settings} for model_type, settings in FAMILIES.items()},
    "gemma4_text": GEMMA4,
    "gemma4_unified_text": GEMMA4,
    "gemma3n_text": GEMMA3N,
    "gemma3": dict(mm_tokens_per_image=4, image_token_index=127, boi_token_index=125, eoi_token_index=126),
    "mistral3": dict(image_token_index=127, spatial_merge_size=1),
    "got_ocr2": dict(image_token_index=127),
    "moss_transcribe_diarize": dict(audio_token_id=127),
    # its rotary embedding is keyed by layer type and multimodal (sections of head_dim / 2 = 8)
    "cohere_compass_text": dict(
        rope_parameters={"full_attention": dict(rope_type="default", rope_theta=10000.0, mrope_section=[4, 2, 2])}
    ),
    # CTRL's ReLU MLP: at its default init most neurons of a tiny model are dead on the proof's inputs
    # (an edit of a dead neuron changes nothing, and the proof wants every edit to do something)
    "ctrl": dict(initializer_range=0.2),
    # LongCat-Flash: its decoder layers hold two sub-layers each (num_hidden_layers is 2 × num_layers), and
    # its router picks among zero-computation experts too (the default 256 would dwarf the 4 routed ones);
    # its rotary embedding is head_dim wide, the rotary part of its q·k heads (qk_rope_head_dim), and its
    # attention expands the latent keys and values to every head (no grouped k/v heads)
    "longcat_flash": dict(num_layers=2, zero_expert_num=2, head_dim=8, num_key_value_heads=4),
    # Cohere's logit_scale (1/16) shrinks an expert neuron's effect below the proof's 1e-4 threshold
    "cohere2_moe": dict(logit_scale=1.0),
}
MAX_PARAMETERS = 4_000_000  # a "tiny" model that is not: a size the rule missed


def _declared(cls: type) -> set[str]:
    """The names a config class accepts: its fields and the standard names it maps to them."""
    return {f.name for f in dataclasses.fields(cls)} | set(getattr(cls, "attribute_map", {}))


def _sizes(cls: type, sizes: dict[str, Any]) -> dict[str, Any]:
    names = _declared(cls)
    out = {k: v for k, v in sizes.items() if k in names}
    if "qk_rope_head_dim" in names:  # MLA: head_dim is the rotary part, set by qk_rope_head_dim
        out.pop("head_dim", None)
    return out


def tiny_family_config(model_type: str, **overrides: Any):
    """A config of ``model_type``'s own class with tiny sizes (see the module docstring); a family
    proven by its group's own tests gets that group's tiny config (the mixture-of-experts families':
    tests/support/tiny_moe.py, the dense ones': tests/support/dense_families.py, with their own keys)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type in MOE_FAMILIES and model_type not in FAMILIES:
        return tiny_moe_config(model_type, **{**OVERRIDES.get(model_type, {}), **overrides})
    if model_type in DENSE_CASES:
        return family_config(model_type, **{**OVERRIDES.get(model_type, {}), **overrides})
    cls = CONFIG_MAPPING[model_type]
    kw = _sizes(cls, SIZES)
    default = cls()
    for key, sub_cls in (getattr(cls, "sub_configs", {}) or {}).items():
        sub = getattr(default, key, None)
        if sub is None and key in TOWERS.get(model_type, ()):
            sub = sub_cls()
        if sub is not None and hasattr(sub, "to_dict"):
            sizes = SIZES if key in TEXT_KEYS else TOWER
            kw[key] = type(sub)(**{**_sizes(type(sub), sizes), **OVERRIDES.get(type(sub).model_type, {})})
    kw.update(OVERRIDES.get(model_type, {}))
    kw.update(overrides)
    return cls(**kw)


def build_family(model_type: str, seed: int = 0, **overrides: Any):
    """A seeded random ``model_type`` model (float32, eval mode) whose every weight matters: the
    random init leaves norms at 1 and biases at 0, so everything is perturbed a little."""
    from surgery.model.loading import auto_class

    torch.manual_seed(seed)
    config = tiny_family_config(model_type, **overrides)
    model = auto_class(model_type).from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model.float().eval()


def save_family(model, path: Path) -> Path:
    """Save ``model`` as its checkpoint folder (transformers' own on-disk names and layout)."""
    model.save_pretrained(path)
    return path


# --- the proof that surgery edits a family -----------------------------------------------------------


def proof_edits(arch) -> dict[str, tuple]:
    """Edits of every kind ``arch``'s layers offer, by group: heads (α 2.5 and 0.5 in the first and
    last layers with heads), dense MLP neurons, routed-expert and shared-expert neurons (each group
    prunes one neuron in its first layer and scales one in its last, the last index included)."""
    from surgery.core.edits import SHARED, HeadScale, NeuronScale

    layers = [(layer, arch.layer_edits(layer)) for layer in range(arch.geometry.num_layers)]
    heads = [(i, e) for i, e in layers if e.heads]
    dense = [(i, e) for i, e in layers if e.neurons]
    sparse = [(i, e) for i, e in layers if e.experts]
    shared = [(i, e) for i, e in layers if e.shared_width]
    groups = {}
    if heads:
        (first, _), (last, e) = heads[0], heads[-1]
        groups["heads"] = (HeadScale(first, 1, 2.5), HeadScale(last, e.heads - 1, 0.5))
    if dense:
        (first, _), (last, e) = dense[0], dense[-1]
        groups["neurons"] = (NeuronScale(first, 3, 0.0), NeuronScale(last, e.neurons - 1, 1.5))
    if sparse:
        (first, _), (last, e) = sparse[0], sparse[-1]
        groups["experts"] = (NeuronScale(first, 2, 0.0, 1), NeuronScale(last, e.expert_width - 1, 2.0, e.experts - 1))
    if shared:
        (first, _), (last, e) = shared[0], shared[-1]
        groups["shared expert"] = (
            NeuronScale(first, 4, 0.0, SHARED),
            NeuronScale(last, e.shared_width - 1, 3.0, SHARED),
        )
    return groups


def _bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    # reshape(-1): a 0-d tensor (Apertus's xIELU parameters) cannot be viewed as bytes
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def prove(model, folder: Path, src: Path | None = None) -> None:
    """The proof that surgery edits ``model``'s family (saved under ``folder``, or already at ``src``):
    every kind of edit its layers offer (proof_edits) changes the run-time output; the bake equals the
    run-time twin on fp32 logits (≤ 1e-5); exactly the tensors the sites resolve to change and every
    other byte (a wrapper's vision or audio tower included) is the source's; verify passes; undo
    restores the source byte for byte; the LoRA adapter equals the edits it can carry and refuses
    the others in one line. ``model`` is wrapped by the adapter at the end: its last use."""
    import json

    import pytest

    import surgery
    from surgery.core.architectures import architecture
    from surgery.core.checkpoint import Checkpoint, file_sha256
    from surgery.core.edits import HeadScale, Recipe
    from surgery.core.errors import RecipeError
    from surgery.core.resolve import Resolver
    from surgery.core.sites import all_sites
    from tests.support.models import load_fp32, logits, stored_tensors

    assert sum(p.numel() for p in model.parameters()) <= MAX_PARAMETERS
    src = src or save_family(model, folder / "src")
    ckpt = Checkpoint(src)
    arch = architecture(ckpt.config)
    groups = proof_edits(arch)
    assert groups, f"{arch.model_type}: no layer offers an edit"
    recipe = Recipe(tuple(e for edits in groups.values() for e in edits))

    base = logits(model)  # every kind of edit does something at run time: the proof is not vacuous
    for name, edits in groups.items():
        assert (logits(model, edits) - base).abs().max().item() > 1e-4, f"the {name} edits change nothing"
    twin = logits(model, recipe.edits)

    baked = folder / "baked"
    surgery.apply(recipe, src, baked)  # the bake, and its own check of each edited map
    assert (logits(load_fp32(baked)) - twin).abs().max().item() <= 1e-5

    before, after = stored_tensors(src), stored_tensors(baked)
    resolved = {sl.tensor for sl in Resolver(arch, ckpt.tensors).all(all_sites(arch, recipe.active()))}
    assert before.keys() == after.keys()
    assert {n for n in before if not _bytes_equal(before[n], after[n])} == resolved
    if arch.layout.config.text_model_types:  # a wrapper: its other towers are there (and untouched, above)
        text = arch.layer_prefix(before).split("layers.")[0]
        assert [n for n in before if not n.startswith((text, "lm_head."))]
    assert (src / "config.json").read_bytes() == (baked / "config.json").read_bytes()
    recorded = {e["tensor"] for e in json.loads((baked / "surgery.json").read_text())["edited_tensors"]}
    assert recorded == resolved

    report = surgery.verify(src, baked)
    assert report.ok, report.problems
    surgery.undo(baked, folder / "restored")
    for f in src.iterdir():
        assert file_sha256(f) == file_sha256(folder / "restored" / f.name), f.name

    exact = tuple(e for e in recipe.active() if e.lora_refusal(arch) is None)
    if len(exact) < len(recipe.active()):
        with pytest.raises(RecipeError) as refused:
            surgery.export_lora(src, recipe, folder / "refused")
        assert "\n" not in str(refused.value) and not (folder / "refused").exists()
    try:
        surgery.export_lora(src, Recipe(exact), folder / "adapter")
    except RecipeError as exc:  # PEFT would move an MLP's adapter onto fused experts (or none is left): heads alone
        assert "\n" not in str(exc) and not (folder / "adapter").exists()
        exact = tuple(e for e in exact if isinstance(e, HeadScale))
        if not exact:
            return
        surgery.export_lora(src, Recipe(exact), folder / "adapter")
    expected = twin if len(exact) == len(recipe.active()) else logits(model, exact)
    from peft import PeftModel

    adapted = PeftModel.from_pretrained(model, folder / "adapter").eval()
    assert (logits(adapted) - expected).abs().max().item() <= 1e-5


def direction_entries(arch) -> list[str]:
    """A direction out of every kind of residual writer ``arch`` has: the first attention layer's output,
    the last Mamba, linear-attention or convolution layer's output projection, the first dense MLP's down matrix, the first sparse layer's routed experts and shared expert, and
    the embeddings (recipe lines for tests.support.directions.direction_recipe)."""
    heads, dense, sparse = arch.head_layers(), arch.dense_mlp_layers(), sorted(arch.geometry.sparse_layers)
    mixers = [layer for layer in range(arch.geometry.num_layers) if "mixer" in arch.residual_writers(layer)]
    entries = [f"layer: {heads[0]}, module: attention, weight: 1.0"] if heads else []
    entries += [f"layer: {mixers[-1]}, module: mixer, weight: 0.75, vector: v.safetensors#s"] if mixers else []
    entries += [f"layer: {dense[0]}, module: mlp, weight: 0.5, vector: v.safetensors#s"] if dense else []
    if sparse:
        entries += [f"layer: {sparse[0]}, module: experts, weight: 1.0"]
        entries += [f"layer: {sparse[0]}, module: shared_experts, weight: 2.0"] if arch.layout.experts.shared else []
    if arch.layout.names.embeddings:
        entries += ["module: embeddings, weight: 0.5"]
    return entries


def prove_direction(model, folder: Path, src: Path) -> None:
    """The direction edit's proof on ``model``'s family (saved at ``src``): projecting a direction out of
    every kind of residual writer (direction_entries) changes the run-time output; the bake equals the
    run-time twin (fp32, ≤ 1e-5); exactly the resolved tensors change; verify passes; undo restores the
    source byte for byte; the rank-1 LoRA adapter of the non-embedding edits equals their twin, or is
    refused in one line (a projected bias, PEFT moving a target onto fused experts)."""

    import surgery
    from surgery.core.architectures import architecture
    from surgery.core.checkpoint import Checkpoint, file_sha256
    from surgery.core.edits import Recipe
    from surgery.core.errors import RecipeError
    from surgery.core.resolve import Resolver
    from surgery.core.sites import all_sites
    from tests.support.directions import direction_recipe
    from tests.support.models import load_fp32, logits, stored_tensors

    ckpt = Checkpoint(src)
    arch = architecture(ckpt.config)
    entries = direction_entries(arch)
    recipe = Recipe.load(direction_recipe(folder / "recipe", entries, hidden=arch.geometry.hidden_size))
    base, twin = logits(model), logits(model, recipe.edits)
    assert (twin - base).abs().max().item() > 1e-4, "the direction edits change nothing"

    baked = folder / "baked"
    surgery.apply(recipe, src, baked)
    assert (logits(load_fp32(baked)) - twin).abs().max().item() <= 1e-5
    before, after = stored_tensors(src), stored_tensors(baked)
    resolved = {sl.tensor for sl in Resolver(arch, ckpt.tensors).all(all_sites(arch, recipe.active()))}
    assert {n for n in before if not _bytes_equal(before[n], after[n])} == resolved
    report = surgery.verify(src, baked)
    assert report.ok, report.problems
    surgery.undo(baked, folder / "restored")
    for f in src.iterdir():
        assert file_sha256(f) == file_sha256(folder / "restored" / f.name), f.name

    layered = Recipe(tuple(e for e in recipe.active() if e.module != "embeddings"))
    if not layered.edits:
        return
    try:
        surgery.export_lora(src, layered, folder / "adapter")
    except RecipeError as exc:
        assert "\n" not in str(exc) and not (folder / "adapter").exists()
        return
    from peft import PeftModel

    adapted = PeftModel.from_pretrained(load_fp32(src), folder / "adapter").eval()
    assert (logits(adapted) - logits(model, layered.edits)).abs().max().item() <= 1e-5


def table_mismatches(model, arch) -> list[str]:
    """Where the table's per-layer view of ``arch`` (every attention matrix a layer has, its dense MLP, its
    other token mixer's output projection, and the attention inputs it lacks) disagrees with the modules transformers built in ``model``."""
    modules = dict(model.named_modules())
    prefix = arch.layer_prefix(modules)
    out = []
    for layer in range(arch.geometry.num_layers):
        here, attention = arch.at(layer), layer in arch.head_layers()
        expected = {m: shape for m, (shape, _) in here.attention_shapes().items()} if attention else {}
        if layer in arch.dense_mlp_layers():
            expected.update(here.mlp_shapes())
        if "mixer" in arch.residual_writers(layer):
            expected.update([here.mixer_output()])
        for module, shape in expected.items():
            shape = arch.stored_shape(module, shape)  # a Conv1D (GPT-2) holds its weight [in, out]
            got = modules.get(arch.module_name(prefix, layer, module))
            if got is None or tuple(got.weight.shape) != shape:
                out.append(
                    f"layer {layer} {module}: table {shape}, model {'none' if got is None else tuple(got.weight.shape)}"
                )
        for name in ("q_proj", "k_proj", "v_proj") if attention else ():
            module = getattr(arch.layout.attention, name)
            if (
                module
                and getattr(here.layout.attention, name) is None
                and arch.module_name(prefix, layer, module) in modules
            ):
                out.append(f"layer {layer} {module}: the table says the layer has none, the model has one")
    return out
