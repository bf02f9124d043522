"""The table's ``fused_homes``: where each per-expert matrix of a checkpoint lies in the loaded model's
fused 3-D experts, checked against transformers' own loading for every per-expert MoE family of the
tiny matrix (its stored matrices found bit for bit at the rows the table names)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from surgery.core.architectures import architecture
from surgery.core.checkpoint import Checkpoint
from tests.support.tiny import MOE_ARCHS

PER_EXPERT = [a for a in MOE_ARCHS if a != "gpt_oss"]  # GPT-OSS is saved fused: it has no per-expert tensors


@pytest.mark.parametrize("arch", PER_EXPERT)
def test_every_per_expert_matrix_is_at_its_home_in_the_loaded_model(tiny, arch):
    from transformers import AutoModelForCausalLM

    src = tiny(arch)
    ckpt = Checkpoint(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    params = dict(model.named_parameters())
    homes = architecture(ckpt.config).fused_homes(ckpt.tensors, params)
    stored = load_file(src / "model.safetensors")
    g = architecture(ckpt.config).geometry
    assert len(homes) == 3 * g.num_experts * len(g.sparse_layers)
    for name, (fused, expert, rows, flipped) in homes.items():
        expert_slice = params[fused][expert]
        got = expert_slice[:, list(rows)].T if flipped else expert_slice[list(rows)]
        assert torch.equal(got, stored[name]), name


def test_fused_checkpoints_and_dense_models_have_none(tiny):
    fused = Checkpoint(tiny("qwen2_moe", fused=True))
    assert architecture(fused.config).fused_homes(fused.tensors, fused.tensors) == {}
    dense = Checkpoint(tiny("llama"))
    assert architecture(dense.config).fused_homes(dense.tensors, dense.tensors) == {}
