"""find-neurons on the dense families of issue 24: the capture reads each family's MLP hidden
activation (the input of down_proj, c_proj, fc2, dense_4h_to_h …) and PPM each neuron's input rows,
GPT-2's Conv1D [in, out] weights included; findings computed end to end, and their top neurons baked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import surgery
from surgery.find.neurons.ppm import ppm_scores
from surgery.model.hooks import layer_module, model_architecture
from tests.support.dense_families import CASES, build_family, family_config
from tests.support.neuron_capture import TEXTS, load_with_char_tokenizer, reference_pooled
from tests.support.neuron_pairs import write_pairs

# Conv1D, fused q/k/v under gpt_neox.layers, OPT's decoder and fc1/fc2, Falcon, MPT, xIELU
CAPTURED = ("gpt2", "gpt_neox", "opt", "falcon", "mpt", "apertus")


@pytest.mark.parametrize("case", CAPTURED)
def test_capture_batched_equals_one_at_a_time(tmp_path, case):
    from surgery.find.neurons.capture import capture_pooled

    model, tok = load_with_char_tokenizer(build_family(case, tmp_path / case))
    parts = []
    capture_pooled(model, tok, TEXTS, lambda start, pooled: parts.append(pooled), batch_size=4)
    batched = torch.cat(parts)
    reference = torch.stack([reference_pooled(model, tok, t) for t in TEXTS])
    g = model_architecture(model).geometry
    assert batched.shape == (len(TEXTS), g.num_layers, g.intermediate_size)
    assert (batched - reference).abs().max().item() <= 1e-5 and reference.abs().max().item() > 1e-3


@pytest.mark.parametrize("case", sorted({t: c for c, (t, _) in reversed(CASES.items())}.values()))
def test_ppm_reads_each_neurons_input_rows(case):
    """max + |min| of each neuron's rows of its MLP input matrices, read here from the modules
    themselves: a transformers Conv1D holds [in, out], so there a neuron's row is a column."""
    from transformers import AutoModelForCausalLM
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(family_config(case)).eval()
    arch = model_architecture(model)
    g = arch.geometry
    expected = np.zeros((g.num_layers, g.intermediate_size))
    for layer in range(g.num_layers):
        for name in arch.mlp_input_modules():
            module = layer_module(model, arch, layer, name)
            w = module.weight.detach().double()
            w = w.T if isinstance(module, Conv1D) else w
            for i in range(g.intermediate_size):
                rows = w[list(arch.neuron_rows(name, i))]
                expected[layer, i] += float((rows.amax(1) + rows.amin(1).abs()).sum())
    np.testing.assert_allclose(ppm_scores(model), expected, rtol=1e-6)


@pytest.mark.parametrize("case", ["gpt2", "opt"])
def test_findings_and_their_bake(tmp_path, case):
    """find-neurons end to end (character tokenizer, a small pairs file), then its top neurons
    pruned: the bake verifies against the run-time twin."""
    from surgery.bake.verify import verify
    from surgery.core.checkpoint import Checkpoint
    from tests.support.tokenizer import save_char_tokenizer

    model = build_family(case, tmp_path / case)
    save_char_tokenizer(model, bos=True)
    pairs = str(write_pairs(tmp_path / "pairs.jsonl"))
    found = surgery.find_neurons(model, pairs=pairs)
    assert found.data.to_dict()["model"]["model_type"] == case
    baked = surgery.prune_neurons(model, tmp_path / "pruned", n=4, pairs=pairs, score="fairness")
    assert baked.tensors_edited > 0 and len(baked.extra["neuron_selection"]["neurons"]) == 4
    assert verify(Checkpoint(model), tmp_path / "pruned").ok
