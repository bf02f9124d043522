"""Real models (marked slow): SmolLM2-135M-Instruct (chat template) and Gemma-3-270M (base prompt).

Small on purpose (a few minutes on 2 CPU cores): a handful of pairs, 2 random head sets.
"""

from __future__ import annotations

import json

import pytest

from surgery.bake.verify import verify
from surgery.cli.main import main
from surgery.core.checkpoint import Checkpoint
from surgery.core.mcq import is_instruct
from surgery.find.heads.benchmark import load_benchmark
from surgery.find.heads.pairs import build_pairs
from surgery.find.heads.scores import encode_pairs
from surgery.model.loading import load_model, load_tokenizer
from tests.support.binding import assert_batching_changes_nothing

pytestmark = pytest.mark.slow(minutes=1)


@pytest.fixture(params=["smollm2", "gemma3_270m"])
def real(request):
    return request.getfixturevalue(request.param)


def test_batched_s_equals_unbatched(real):
    tok, model = load_tokenizer(real), load_model(real)
    assert is_instruct(tok) == ("smollm2" in str(real))  # one instruct path, one base path
    pairs = build_pairs(load_benchmark("builtin"), seed=0, max_pairs=4)
    prompts = encode_pairs(tok, pairs[:2], "binding") + encode_pairs(tok, pairs[2:3], "knowledge")
    assert_batching_changes_nothing(model, tok, prompts, batch_size=6, atol=1e-4)


@pytest.mark.slow(minutes=2)
def test_find_heads_then_amplify_heads(real, tmp_path, capsys):
    common = ["--max-pairs", "8", "--random-sets", "2"]
    main(["find-heads", str(real), *common, "--out", str(tmp_path / "f.json")])
    f = json.loads((tmp_path / "f.json").read_text())
    assert len(f["selected_heads"]) == 3 and 0 <= f["discovery"]["auc"] <= 1
    assert f["prompt_format"] == ("instruct" if "smollm2" in str(real) else "base")
    out_dir = tmp_path / "amplified"
    main(["amplify-heads", str(real), "--alpha", "2.5", *common, "--out", str(out_dir)])
    assert "Heads from findings" in capsys.readouterr().out
    report = verify(Checkpoint(real), out_dir)
    assert report.ok
    prov = json.loads((out_dir / "surgery.json").read_text())
    assert [[e["layer"], e["head"]] for e in prov["recipe"]["edits"]] == f["selected_heads"]
    from transformers import AutoModelForCausalLM

    baked = AutoModelForCausalLM.from_pretrained(out_dir)  # stock transformers, no custom code
    assert baked.config.model_type == load_model(real).config.model_type
