"""The scale guards (surgery.bake.guards) on every path that scales a head or a neuron: the library
bake itself, apply, prune-neurons --factor and amplify-heads; --allow-zero where a scale can vanish."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from surgery.bake.bake import bake
from surgery.bake.guards import HUGE
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import RecipeError
from tests.support.cli import error_line, run_main

O_PROJ0 = "model.layers.0.self_attn.o_proj.weight"
DOWN0 = "model.layers.0.mlp.down_proj.weight"


def _tensor(folder, name: str) -> torch.Tensor:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return f.get_tensor(name)


def _ok(args, capsys) -> None:
    result = run_main(args, capsys)
    assert result.returncode == 0, result.stderr


def test_the_overflow_bound_is_exact_in_the_library_bake(tiny, tmp_path):
    """The Python API gets the check the commands get: a scale that puts head 0.1's largest weight
    just under 2^64 bakes, one just over is refused before anything is written."""
    src = tiny("llama")
    peak = float(_tensor(src, O_PROJ0)[:, 8:16].abs().max())
    bake(Checkpoint(src), Recipe((HeadScale(0, 1, 0.999 * HUGE / peak),)), tmp_path / "under")
    assert _tensor(tmp_path / "under", O_PROJ0)[:, 8:16].abs().max() < HUGE
    with pytest.raises(RecipeError, match=r"head 0\.1 up to .*past 2\^64"):
        bake(Checkpoint(src), Recipe((HeadScale(0, 1, 1.001 * HUGE / peak),)), tmp_path / "over")
    assert not (tmp_path / "over").exists()


def test_library_bake_refuses_a_vanishing_factor_unless_allowed(tiny, tmp_path):
    src = tiny("llama", dtype=torch.bfloat16)
    recipe = Recipe((NeuronScale(0, 1, 1e-40),))
    with pytest.raises(RecipeError, match="factor 1e-40 rounds every weight of neuron 0:1 to zero in this BF16"):
        bake(Checkpoint(src), recipe, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    bake(Checkpoint(src), recipe, tmp_path / "allowed", allow_zero=True)
    assert not _tensor(tmp_path / "allowed", DOWN0)[:, 1].any()


def test_apply_allow_zero(tiny, tmp_path, capsys):
    """apply: a recipe α that underflows needs --allow-zero; α = 0 itself (ablation) needs no flag."""
    src = tiny("llama")
    tiny_alpha, zero = tmp_path / "tiny.yaml", tmp_path / "zero.yaml"
    tiny_alpha.write_text("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: 1.0e-50}\n")
    zero.write_text("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: 0.0}\n")
    line = error_line(run_main(["apply", tiny_alpha, "--model", src, "--out", tmp_path / "a"], capsys))
    assert "alpha 1e-50 rounds every weight of head 0.1 to zero" in line and "--allow-zero" in line
    _ok(["apply", tiny_alpha, "--model", src, "--out", tmp_path / "a", "--allow-zero"], capsys)
    _ok(["apply", zero, "--model", src, "--out", tmp_path / "z"], capsys)
    for out in ("a", "z"):
        w = _tensor(tmp_path / out, O_PROJ0)
        assert not w[:, 8:16].any() and w[:, :8].abs().min() > 0


def test_prune_neurons_factor_allow_zero(tiny, tmp_path, capsys):
    """prune-neurons --factor 1e-40 on bf16 weights: refused, then with --allow-zero the neuron's
    down_proj column is zero while its gate/up rows stay (a scale, not a pruning)."""
    src = tiny("llama", dtype=torch.bfloat16)
    args = ["prune-neurons", src, "--neurons", "0:1", "--factor", "1e-40", "--out", tmp_path / "out"]
    line = error_line(run_main(args, capsys))
    assert "factor 1e-40 rounds every weight of neuron 0:1 to zero in this BF16 checkpoint" in line
    assert not (tmp_path / "out").exists()
    _ok([*args, "--allow-zero"], capsys)
    assert not _tensor(tmp_path / "out", DOWN0)[:, 1].any()
    assert _tensor(tmp_path / "out", "model.layers.0.mlp.gate_proj.weight")[1].abs().min() > 0
