"""ablate-direction on hybrid models projects through every residual writer the table can edit exactly
(issue 33, point 10): the attention output, a Mamba block's, linear attention's or a short convolution's
output projection (``module: mixer``), the MLP's or every expert's down matrix; the writers it cannot
project are named in one line, and ``surgery inspect`` lists the writers of each kind of layer.

Each case runs the user's path on a tiny random model of the family: find-direction, then the default
ablate-direction (every layer, attention,mlp); the bake equals the run-time twin (hooks) on fp32 logits
within 1e-5, exactly the resolved tensors change (names, shapes, dtypes and config.json as they were),
and the LoRA adapter of the edits that have one equals their twin.
"""

from __future__ import annotations

import json

import pytest
import torch

import surgery
from surgery.core.architectures import architecture
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import DirectionEdit, Recipe
from surgery.core.errors import RecipeError
from surgery.core.resolve import Resolver
from surgery.core.sites import all_sites
from surgery.find.directions.ablate import unprojected_note
from surgery.find.directions.params import KernelParams
from tests.support.cli import run_main
from tests.support.directions import direction_recipe
from tests.support.families import build_family, family_config
from tests.support.models import load_fp32, logits, stored_tensors
from tests.support.tokenizer import TINY_VOCAB, save_char_tokenizer

# The reported cases (Falcon-H1: a Mamba block beside the attention of every layer; Qwen3-Next: gated
# delta-net layers between attention layers, experts everywhere) and variants: Bamba (Mamba layers
# between attention layers), LFM2 (short-convolution layers).
CASES = {
    "falcon_h1": "mamba.out_proj",
    "qwen3_next": "linear_attn.out_proj",
    "bamba": "mamba.out_proj",
    "lfm2": "conv.out_proj",
}


def _found(src, tmp_path):
    """find-direction's findings on ``src`` (a char tokenizer saved beside it)."""
    save_char_tokenizer(src)
    (tmp_path / "a.txt").write_text("the sky is green\nno red is blue\nwhat is this\n")
    (tmp_path / "b.txt").write_text("a quiet day\nmost cats sleep\nrain again\n")
    return surgery.find_direction(src, a=tmp_path / "a.txt", b=tmp_path / "b.txt", device="cpu")


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("model_type", list(CASES))
def test_default_ablate_direction_projects_every_residual_writer(model_type, tmp_path):
    src = build_family(model_type, tmp_path / "src", vocab_size=TINY_VOCAB)
    found = _found(src, tmp_path)
    notes: list[str] = []
    out = tmp_path / "out"
    baked = surgery.ablate_direction(
        src, out, direction=found.path, weight=0.75, callbacks=surgery.Callbacks(report=notes.append)
    )
    ckpt = Checkpoint(src)
    arch = architecture(ckpt.config)
    edits = baked.provenance.recipe.edits

    # Every writer of every layer, the mixer's included, once; nothing the table cannot edit exactly.
    every = {(layer, m) for layer in range(arch.geometry.num_layers) for m in arch.residual_writers(layer).values()}
    assert sorted((e.layer, arch.residual_writers(e.layer)[e.module]) for e in edits) == sorted(every)
    assert {e.layer for e in edits if e.module == "mixer"} == set(arch.mixer_layers()) != set()
    assert not [n for n in notes if "not projected" in n]
    assert "not_projected" not in json.loads((out / "surgery.json").read_text())["direction_kernel"]

    # The bake equals the run-time twin, which the edit changes.
    model = load_fp32(src)
    base, twin = logits(model), logits(model, edits)
    assert (twin - base).abs().max().item() > 1e-3
    assert (logits(load_fp32(out)) - twin).abs().max().item() <= 1e-5

    # Exactly the resolved tensors change, the mixer's output projection among them; nothing else does.
    before, after = stored_tensors(src), stored_tensors(out)
    assert {n: (t.shape, t.dtype) for n, t in before.items()} == {n: (t.shape, t.dtype) for n, t in after.items()}
    resolved = {sl.tensor for sl in Resolver(arch, ckpt.tensors).all(all_sites(arch, edits))}
    assert {n for n in before if not _same_bytes(before[n], after[n])} == resolved
    assert {n for n in resolved if CASES[model_type] in n}
    assert (src / "config.json").read_bytes() == (out / "config.json").read_bytes()

    # The LoRA adapter: every edit that has one equals its twin; a mixer PEFT refuses is one line.
    recipe = Recipe(edits)
    refused = [e for e in edits if e.lora_refusal(arch)]
    if refused:
        with pytest.raises(RecipeError, match="PEFT refuses a LoRA") as exc:
            surgery.export_lora(src, recipe, tmp_path / "refused")
        assert "\n" not in str(exc.value) and not (tmp_path / "refused").exists()
    # PEFT moves an MLP target of a mixture of experts onto its fused experts (export-lora refuses that,
    # tests/ship): there the adapter carries the attention side, the mixer included.
    sides = ("attention", "mixer") if arch.layout.experts else tuple({e.module for e in edits})
    adaptable = Recipe(tuple(e for e in edits if e not in refused and e.module in sides))
    assert adaptable.edits
    surgery.export_lora(src, adaptable, tmp_path / "adapter")
    from peft import PeftModel

    adapted = PeftModel.from_pretrained(load_fp32(src), tmp_path / "adapter").eval()
    assert (logits(adapted) - logits(model, adaptable.edits)).abs().max().item() <= 1e-5


def test_a_mixer_config_json_does_not_size_is_named_in_one_line(tmp_path, capsys):
    """Falcon-H1 whose config.json lacks mamba_d_ssm (transformers then takes its class default, 1024): the
    table does not guess it, so the default run edits the other writers and names mamba.out_proj in one line."""
    src = build_family(
        "falcon_h1", tmp_path / "src", vocab_size=TINY_VOCAB, mamba_d_ssm=1024, mamba_n_heads=8, mamba_d_head=128
    )
    config = json.loads((src / "config.json").read_text())
    del config["mamba_d_ssm"]
    (src / "config.json").write_text(json.dumps(config))
    found = _found(src, tmp_path)

    result = run_main(["ablate-direction", src, "--direction", found.path, "--out", tmp_path / "out"], capsys)
    assert result.returncode == 0, result.stderr
    (line,) = [ln for ln in result.stderr.splitlines() if "not projected" in ln]
    assert line.endswith(
        "ablate-direction: not projected (the table cannot edit them exactly): layers 0, 1, 2, 3: mamba.out_proj "
        "(config.json does not give its width: mamba_d_ssm, else mamba_expand × hidden_size)"
    )
    record = json.loads((tmp_path / "out" / "surgery.json").read_text())
    assert record["direction_kernel"]["not_projected"] in line
    assert {e["module"] for e in record["recipe"]["edits"]} == {"attention", "mlp"}
    inspected = surgery.inspect(src).layer_kinds
    assert [k["unprojected"] for k in inspected] == [[line.split("layers 0, 1, 2, 3: ")[1]]]


@pytest.mark.parametrize(
    "model_type,config,needle",
    [
        # Nemotron-H's expert layers ("E"): the table does not describe their mixture of experts
        (
            "nemotron_h",
            {"layers_block_type": ["linear_attention", "full_attention", "moe", "mlp"]},
            "layers 2: experts (this table row does not describe its mixture of experts)",
        ),
        # a family whose attention output the table has no head layout for
        ("laguna", {}, "the attention output self_attn.o_proj (the table has no head layout to size it by)"),
    ],
)
def test_writers_the_table_cannot_project_are_named(model_type, config, needle):
    from tests.support.coverage import tiny_family_config

    cfg = {**tiny_family_config(model_type).to_dict(), **config}
    arch = architecture(cfg)
    layers = list(range(arch.geometry.num_layers))
    note = unprojected_note(KernelParams(), arch, layers)
    assert note.startswith("not projected (the table cannot edit them exactly): ") and needle in note
    assert "\n" not in note
    side = "mlp" if model_type == "nemotron_h" else "attention"
    other = "attention" if side == "mlp" else "mlp"
    assert unprojected_note(KernelParams(modules=other), arch, layers) is None  # only the sides asked for


def test_inspect_lists_the_residual_writers_per_kind_of_layer(tmp_path):
    src = build_family("qwen3_next", tmp_path / "src")
    linear, full = surgery.inspect(src).layer_kinds
    experts = ["mlp.experts.E.down_proj", "mlp.shared_expert.down_proj"]  # expert E's, as the file holds it
    assert (linear["layers"], linear["writers"]) == ([0, 2], ["linear_attn.out_proj", *experts])
    assert (full["layers"], full["writers"]) == ([1, 3], ["self_attn.o_proj", *experts])
    assert "residual writers: linear_attn.out_proj, mlp.experts.E.down_proj" in linear["summary"]
    (every,) = surgery.inspect(build_family("falcon_h1", tmp_path / "falcon")).layer_kinds
    assert every["writers"] == ["self_attn.o_proj", "mamba.out_proj", "feed_forward.down_proj"]


def test_a_mixer_edit_names_the_layers_that_have_one(tmp_path):
    """module: mixer on an attention layer, attention on a linear-attention layer: one line each."""
    arch = architecture(family_config("qwen3_next").to_dict())
    cases = {
        "layer: 1, module: mixer, weight: 1.0": "edits[0].module = mixer but layer 1 of this qwen3_next model is a "
        "full_attention layer without linear_attn.out_proj (it is in layers 0, 2); use attention",
        "layer: 0, module: attention, weight: 1.0": "edits[0].module = attention but layer 0 is a linear_attention "
        "layer: it writes through linear_attn.out_proj; use mixer",
    }
    for i, (entry, message) in enumerate(cases.items()):
        recipe = Recipe.load(direction_recipe(tmp_path / str(i), [entry]))
        with pytest.raises(RecipeError) as exc:
            recipe.edits[0].validate(arch, "edits[0]")
        assert str(exc.value) == message
    llama = architecture({**family_config("qwen3_next").to_dict(), "model_type": "qwen3"})
    with pytest.raises(RecipeError, match="qwen3 has no token mixer other than attention; use attention"):
        DirectionEdit(module="mixer", vector="v.safetensors#r", weight=1.0, layer=0, unit=b"\0" * 128).validate(
            llama, "edits[0]"
        )


def test_a_kernel_that_reaches_no_writer_is_one_line(tmp_path):
    """Nemotron-H's layer 0 is a Mamba layer without MLP: --modules mlp --layers 0 names no writer."""
    from surgery.core.errors import ParameterError

    src = build_family("nemotron_h", tmp_path / "src", vocab_size=TINY_VOCAB)
    found = _found(src, tmp_path)
    with pytest.raises(ParameterError) as exc:
        surgery.ablate_direction(src, tmp_path / "out", direction=found.path, modules="mlp", layers="0")
    assert str(exc.value) == (
        "modules mlp names no residual writer the table can project in layers 0 of this nemotron_h model; "
        "choose other layers or modules"
    )
    assert not (tmp_path / "out").exists()
    baked = surgery.ablate_direction(src, tmp_path / "out", direction=found.path, layers="0")  # its Mamba output
    assert [(e.layer, e.module) for e in baked.provenance.recipe.edits] == [(0, "mixer")]
