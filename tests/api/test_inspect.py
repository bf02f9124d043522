"""surgery inspect: what each kind of layer lets an edit touch, and why a model is refused, from the
config and the safetensors headers alone."""

from __future__ import annotations

import json

import pytest

import surgery
from tests.support.cli import error_line, run_main
from tests.support.coverage import build_family, save_family


@pytest.fixture
def no_model(monkeypatch):
    """Any model load fails the test: inspect reads headers only."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("inspect loaded a model")

    for name in ("AutoModelForCausalLM", "AutoModelForImageTextToText"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", refuse)


def _config(path, **changes) -> None:
    """Change top-level (or, with ``text_config``, nested) fields of ``path``'s config.json."""
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if isinstance(value, dict):
            config[key].update(value)
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))


def test_layer_kinds_of_a_mixture_of_experts(tiny, no_model):
    """Qwen2-MoE with layer 1 dense: two kinds of layer, each with what an edit may touch."""
    info = surgery.inspect(tiny("qwen2_moe", mlp_only_layers=[1]))
    assert info.supported is True
    moe, dense = info.layer_kinds
    assert moe == {
        "layers": [0, 2],
        "heads": 4,
        "experts": 4,
        "expert_width": 16,
        "shared_width": 24,
        "writers": ["self_attn.o_proj", "mlp.experts.E.down_proj", "mlp.shared_expert.down_proj"],
        "summary": "layers 0, 2: 4 heads; 4 experts × 16 neurons; shared expert: 24 neurons; residual writers: "
        "self_attn.o_proj, mlp.experts.E.down_proj, mlp.shared_expert.down_proj",
    }
    assert dense == {
        "layers": [1],
        "heads": 4,
        "neurons": 48,
        "writers": ["self_attn.o_proj", "mlp.down_proj"],
        "summary": "layers 1: 4 heads; 48 MLP neurons; residual writers: self_attn.o_proj, mlp.down_proj",
    }


def test_expert_writers_are_named_as_the_file_stores_them(tiny, no_model):
    """Mixtral's files hold block_sparse_moe.experts.E.w2, not transformers' in-memory mlp.experts.down_proj;
    a checkpoint saved fused holds that one."""
    from safetensors import safe_open

    for fused, down, tensor in (
        (False, "block_sparse_moe.experts.E.w2", "block_sparse_moe.experts.3.w2.weight"),
        (True, "mlp.experts.down_proj", "mlp.experts.down_proj"),  # a 3-D parameter, no .weight
    ):
        model = tiny("mixtral", fused=fused)
        (kind,) = surgery.inspect(model).layer_kinds
        assert kind["writers"] == ["self_attn.o_proj", down]
        assert kind["summary"].endswith(f"residual writers: self_attn.o_proj, {down}")
        with safe_open(model / "model.safetensors", "pt") as f:
            assert f"model.layers.0.{tensor}" in set(f.keys())


def test_a_dense_model_has_one_kind_and_the_cli_prints_it(tiny, no_model, capsys):
    model = tiny("llama")
    summary = "layers 0–2: 4 heads; 48 MLP neurons; residual writers: self_attn.o_proj, mlp.down_proj"
    assert surgery.inspect(model).to_dict()["layer_kinds"] == [
        {
            "layers": [0, 1, 2],
            "heads": 4,
            "neurons": 48,
            "writers": ["self_attn.o_proj", "mlp.down_proj"],
            "summary": summary,
        }
    ]
    result = run_main(["inspect", model], capsys)
    text = " ".join(result.stdout.replace("│", " ").split())  # the table wraps its cells
    assert result.returncode == 0 and summary in text


def test_a_refused_family_is_reported_with_its_reason(tmp_path, no_model, capsys):
    """Mamba has no heads and no MLP: inspect says so; a bake of it is one line and writes nothing."""
    src = save_family(build_family("mamba"), tmp_path / "mamba")
    info = surgery.inspect(src)
    assert info.supported is False and info.model_type == "mamba" and info.tensors > 0
    assert info.refused == (
        "model_type 'mamba' is not supported: Mamba layers only: no attention heads, and "
        "no MLP (the mixer gates a selective state-space scan)"
    )
    printed = json.loads(run_main(["inspect", src, "--json"], capsys).stdout)
    assert printed == info.to_dict()
    line = error_line(run_main(["prune-neurons", src, "--neurons", "0:1", "--out", tmp_path / "out"], capsys))
    assert line == f"Error: {info.refused}"
    assert not (tmp_path / "out").exists()


def test_a_wrapper_around_another_text_model_is_refused(tmp_path, no_model, capsys):
    """A Mistral-3 whose text_config says qwen2: the mistral3 row does not describe that decoder."""
    src = save_family(build_family("mistral3"), tmp_path / "mistral3")
    _config(src, text_config={"model_type": "qwen2"})
    why = (
        "mistral3: its text_config has model_type 'qwen2', but the table's mistral3 row describes a mistral "
        "or ministral3 text decoder; extend surgery/core/architectures/ (the ARCHITECTURES table)"
    )
    assert surgery.inspect(src).refused == why
    line = error_line(
        run_main(["amplify-heads", src, "--heads", "0.1", "--alpha", "2", "--out", tmp_path / "o"], capsys)
    )
    assert line == f"Error: {why}" and not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "arch, change, tensor",
    [
        ("llama", {"intermediate_size": 40}, "model.layers.0.mlp.down_proj.weight"),
        ("qwen2_moe", {"moe_intermediate_size": 12}, "model.layers.0.mlp.experts.0.down_proj.weight"),
        ("qwen2_moe", {"num_experts": 6}, "model.layers.0.mlp.experts.5.down_proj.weight"),
        ("qwen2_moe", {"shared_expert_intermediate_size": 20}, "model.layers.0.mlp.shared_expert.down_proj.weight"),
    ],
)
def test_a_config_that_contradicts_its_tensors_is_one_line(tiny, no_model, capsys, arch, change, tensor):
    """Sizes are checked against the headers of every tensor an edit could touch, not only at bake time."""
    src = tiny(arch)
    _config(src, **change)
    line = error_line(run_main(["inspect", src], capsys))
    assert f"'{tensor}'" in line
