"""find-heads → amplify-heads on mixtures of experts: heads work there as in dense models."""

from __future__ import annotations

import json

import pytest

from tests.support.binding import FAST, char_model, write_small_benchmark
from tests.support.cli import main_stdout


@pytest.mark.parametrize("arch", ["qwen2_moe", "gpt_oss"])
def test_find_heads_then_amplify_heads_on_a_moe(tiny, tmp_path, capsys, arch):
    """Heads in mixtures of experts work as in dense models: find-heads → amplify-heads, verified."""
    model = char_model(tiny, arch)
    bench = write_small_benchmark(tmp_path / "small.jsonl")
    out = main_stdout(capsys, "find-heads", model, "--benchmark", bench, *FAST, "--out", tmp_path / "f.json")
    assert "Edge knockout" in out
    baked = tmp_path / "baked"
    out = main_stdout(
        capsys, "amplify-heads", model, "--alpha", "2.5", "--top", "2", "--benchmark", bench, *FAST, "--out", baked
    )
    assert "Baked 2 edits" in out
    check = json.loads((baked / "surgery.json").read_text())["verification"]
    assert (
        check["kind"] == "edited maps" and check["maps"] in (1, 2) and check["max_diff_over_bound"] <= 1.0
    )  # 2 heads: 1 or 2 o_proj
    from surgery.bake.verify import verify
    from surgery.core.checkpoint import Checkpoint

    report = verify(Checkpoint(model), baked)  # end to end: the logits of the baked MoE
    assert report.ok and report.max_abs_logit_diff <= 1e-5, report.problems
