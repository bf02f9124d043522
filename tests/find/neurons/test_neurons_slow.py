"""SmolLM2-135M-Instruct with the public English fairness-pruning pairs (run with -m slow)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from surgery.find.neurons.pairs import check_token_counts, load_pairs
from surgery.find.neurons.ppm import ppm_scores
from surgery.find.neurons.scores import NeuronScores, accumulate_pair_sums
from surgery.model.loading import load_model, load_tokenizer
from tests.support.cli import main_output
from tests.support.neuron_capture import reference_pooled
from tests.support.paths import REPO

SHARED = Path(os.environ.get("SURGERY_SHARED_DATA", REPO.parent / "shared" / "data"))
PUBLIC_EN = SHARED / "fairness_pruning" / "prompt_pairs_en.json"

pytestmark = [
    pytest.mark.slow(minutes=1),
    pytest.mark.skipif(not PUBLIC_EN.is_file(), reason="public fairness-pruning pairs not present"),
]


def test_bias_score_matches_unbatched_reference(smollm2):
    model, tok = load_model(smollm2), load_tokenizer(smollm2)
    pairs = check_token_counts(load_pairs(str(PUBLIC_EN)), tok).kept.pairs
    table = NeuronScores.from_sums(accumulate_pair_sums(model, tok, pairs, batch_size=16), ppm_scores(model))
    diffs: dict[str, list[torch.Tensor]] = {}
    for p in pairs:  # batch size 1, no padding, full forward
        d = reference_pooled(model, tok, p.prompt_1).double() - reference_pooled(model, tok, p.prompt_2).double()
        diffs.setdefault(p.category, []).append(d)
    for category, ds in diffs.items():
        reference = torch.stack(ds).abs().mean(0).numpy()
        # 1e-4 absolute, plus 1e-3 relative: the score is a difference of fp32 activations, and on the
        # last layer's massive-activation neurons (pooled values in the tens) a batch of 16 and a
        # batch of 1 run different GEMM blockings, which round differently (one neuron of 46,080,
        # 28.678 at 0.228, differed by 1.3e-4 on a CI machine).
        np.testing.assert_allclose(table.bias[category], reference, rtol=1e-3, atol=1e-4)
    # the raw score concentrates in the last layer, as optipfair's BiasScore does on SmolLM2
    # (docs/methods/fairness-pruning.md)
    pooled = table.pooled("bias", table.categories).ravel()
    top40_layers = np.argsort(-pooled, kind="stable")[:40] // table.shape[1]
    assert (top40_layers == table.shape[0] - 1).sum() >= 30


def test_prune_40_with_defaults_still_knows_paris(smollm2, tmp_path, capsys):
    code, _, err = main_output(
        capsys, "prune-neurons", smollm2, "--pairs", PUBLIC_EN, "--n", 40, "--out", tmp_path / "out"
    )
    assert code == 0, err
    prov = json.loads((tmp_path / "out" / "surgery.json").read_text())
    assert len(prov["recipe"]["edits"]) == 40 and prov["neuron_selection"]["n"] == 40
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tok = load_tokenizer(tmp_path / "out")
    ids = tok("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = model.eval().generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    assert "Paris" in tok.decode(out[0, ids.shape[1] :])
