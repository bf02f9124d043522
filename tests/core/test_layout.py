"""A table row is a ``Layout`` of typed parts: every row of the table is well-formed, part by part."""

from __future__ import annotations

import dataclasses

import pytest

from surgery.core.architectures import (
    ARCHITECTURES,
    Attention,
    Config,
    Experts,
    Layers,
    Layout,
    Limits,
    Mlp,
    Names,
    Tail,
    experts,
    records,
)

PARTS = {
    "names": Names,
    "attention": Attention,
    "mlp": Mlp,
    "layers": Layers,
    "tail": Tail,
    "limits": Limits,
    "config": Config,
}
# Records a part holds; Experts and its parts (see docs/contributing/adding-an-architecture.md).
RECORDS = (records.ConfigKeys, records.Mixer, records.NativeName, records.LayerSizes)
EXPERT_PARTS = {
    "keys": experts.ExpertKeys,
    "weights": experts.ExpertWeights,
    "shared": experts.SharedExpert,
    "layers": experts.SparseLayers,
}
_KEYS = experts.ExpertKeys(("num_experts",), "moe_intermediate_size")


def _modules(layout: Layout) -> list[str]:
    """Every module name the row's attention, MLP and other mixer give (None: absent)."""
    att, mlp, mixer = layout.attention, layout.mlp, layout.layers.mixer
    names = [att.o_proj, att.q_proj, att.k_proj, att.v_proj, att.qkv_proj, mlp.down_proj, mlp.gate_proj]
    names += [mlp.up_proj, mlp.gate_up_proj, mixer.module if mixer else None]
    return [n for n in names if n is not None]


def _expert_problems(ex: Experts) -> list[str]:
    """What is wrong with a row's experts, one line each: each part of its type, its names dotted."""
    if not isinstance(ex, Experts):
        return [f"experts is a {type(ex).__name__}"]
    out = [
        f"experts.{name} is a {type(getattr(ex, name)).__name__}, not a {part.__name__}"
        for name, part in EXPERT_PARTS.items()
        if type(getattr(ex, name)) is not part and not (name == "shared" and ex.shared is None)
    ]
    if out:
        return out
    if type(ex.layers.rule) is not experts.StepRule:
        return [f"experts.layers.rule is a {type(ex.layers.rule).__name__}, not a StepRule"]
    shared = ex.shared
    names = [ex.weights.module, *(ex.weights.per_expert or ())]
    names += [shared.module, *(f"{shared.module}.{m}" for m in (*shared.inputs, shared.down))] if shared else []
    bad = [n for n in names if not n or n.strip(".") != n]
    out += [f"expert module name {n!r} is not a dotted name relative to a layer" for n in bad]
    if ex.weights.per_expert and any("{expert}" not in n for n in ex.weights.per_expert):
        out.append(f"per-expert names {ex.weights.per_expert} must each hold {{expert}}")
    if ex.weights.dispatch not in ("routed", "dense", "looped"):
        out.append(f"dispatch {ex.weights.dispatch!r} is not routed, dense or looped")
    if not ex.keys.num_keys or ex.layers.rule.step < 1:
        out.append("experts need a count key, and the step rule's step is at least 1")
    return out


def problems(layout: Layout) -> list[str]:
    """What is wrong with a row, one line each (nothing for a well-formed row)."""
    out = [
        f"{name} is a {type(getattr(layout, name)).__name__}, not a {part.__name__}"
        for name, part in PARTS.items()
        if type(getattr(layout, name)) is not part
    ]
    if out:
        return out
    if layout.experts is not None:
        out += _expert_problems(layout.experts)
    prefixes, att, mlp = layout.names.layer_prefixes, layout.attention, layout.mlp
    if not prefixes or any("{layer}" not in p or not p.endswith(".") for p in prefixes):
        out.append(f"layer prefixes {prefixes} must each hold {{layer}} and end with '.'")
    for name in _modules(layout):
        if not name or name.startswith(".") or name.endswith("."):
            out.append(f"module name {name!r} is not a dotted name relative to a layer")
        if "{sub}" in name and layout.layers.sub_layers == 1:
            out.append(f"{name} names a block, but the row has one block per layer")
    if att.qkv_proj and (att.q_proj or att.k_proj or att.v_proj):
        out.append("a fused qkv_proj and separate q/k/v projections")
    if mlp.gate_up_proj and (mlp.gate_proj or mlp.up_proj):
        out.append("a fused gate_up_proj and separate gate/up projections")
    if att.mla and (att.q_proj or att.k_proj or att.v_proj):
        out.append("MLA names its own q/kv matrices; q_proj, k_proj and v_proj must be None")
    if bool(layout.config.text_model_types) != bool(layout.config.text_config_key):
        out.append("a wrapper names both its text model types and its text_config key")
    if layout.layers.sub_layers < 1 or mlp.ffn_divisor < 1:
        out.append("sub_layers and ffn_divisor are at least 1")
    limits = layout.limits
    for why in (limits.head_refusal, limits.find_heads_refusal, limits.find_refusal):
        if why is not None and (not why.strip() or "\n" in why):
            out.append(f"a refusal is one line: {why!r}")
    return out


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_every_row_is_well_formed(model_type):
    assert problems(ARCHITECTURES[model_type]) == []


@pytest.mark.parametrize(
    ("row", "words"),
    [
        (Layout(Names(("model.layers.",))), "{layer}"),
        (Layout(attention=Attention(qkv_proj="self_attn.qkv_proj")), "fused qkv_proj"),
        (Layout(mlp=Mlp(gate_up_proj="mlp.gate_up_proj")), "fused gate_up_proj"),
        (Layout(attention=Attention(o_proj="self_attn.{sub}.o_proj")), "one block per layer"),
        (Layout(config=Config(text_config_key="text_config")), "wrapper"),
        (Layout(limits=Limits(head_refusal="two\nlines")), "one line"),
        (Layout(mlp=Mlp(down_proj="mlp.down_proj.")), "dotted name"),
        (Layout(mlp=Attention()), "not a Mlp"),  # type: ignore[arg-type]
        (Layout(experts=Experts(_KEYS, experts.ExpertWeights(("mlp.experts.w1", "b", "c")))), "{expert}"),
        (Layout(experts=Experts(_KEYS, experts.ExpertWeights(None, dispatch="batched"))), "dispatch"),
        (
            Layout(experts=Experts(_KEYS, experts.ExpertWeights(None), experts.SharedExpert("mlp.shared.", "w"))),
            "dotted",
        ),
        (Layout(experts=Experts(_KEYS, experts.ExpertKeys(("n",), "w"))), "not a ExpertWeights"),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_row_is_named(row, words):
    assert any(words in p for p in problems(row)), problems(row)


@pytest.mark.parametrize("cls", [Layout, *PARTS.values(), *RECORDS, Experts, *EXPERT_PARTS.values(), experts.StepRule])
def test_parts_are_small_frozen_records(cls):
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    assert len(dataclasses.fields(cls)) <= 8, f"{cls.__name__}: split it into parts grouped by meaning"


def test_layout_is_its_parts():
    assert {f.name for f in dataclasses.fields(Layout)} == {*PARTS, "experts"}
    assert Layout() == Layout(Names(), Attention(), Mlp(), None, Layers(), Tail(), Limits(), Config())


def test_the_default_row_is_a_llama_shaped_decoder():
    """A row names only what differs from Llama's: Llama's row is the default one."""
    assert ARCHITECTURES["qwen2"] == Layout()
    assert ARCHITECTURES["llama"] == Layout(Names(native_names=ARCHITECTURES["llama"].names.native_names))
