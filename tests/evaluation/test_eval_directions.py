"""What eval measures of a direction edit: first-token KL on neutral prompts (mean, p95, p99, per
language) and the share of answers that hold one of the user's markers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import surgery
from surgery.evaluation.lm import kl_divergence
from tests.support.cli import error_line, run_main
from tests.support.paths import FIXTURES

FIXTURE = FIXTURES / "direction_model"


def test_first_token_kl_per_language():
    rng = torch.Generator().manual_seed(0)
    reference = [torch.log_softmax(torch.randn(n, 5, generator=rng), -1) for n in (3, 1, 4, 2)]
    model = [torch.log_softmax(torch.randn(n, 5, generator=rng), -1) for n in (3, 1, 4, 2)]
    out = kl_divergence(reference, model, ["en", "es", "en", "es"])
    last = np.array([float((p[-1].exp() * (p[-1] - q[-1])).sum()) for p, q in zip(reference, model)])
    first = out["first_token"]
    assert first["mean"] == pytest.approx(last.mean()) and first["n"] == 4
    assert first["p95"] == pytest.approx(np.percentile(last, 95)) and first["p99"] <= last.max() + 1e-12
    assert first["per_language"]["en"]["mean"] == pytest.approx(last[[0, 2]].mean())
    assert first["per_language"]["es"]["n"] == 2
    assert math.isfinite(out["kl_mean"]) and "first_token" not in kl_divergence(reference, model)
    # EvalResult.metrics showed kl_mean as np.float64(…) beside Python floats
    assert all(type(out[k]) in (float, int) for k in ("kl_mean", "kl_max", "positions", "top1_agreement"))


@pytest.fixture(scope="module")
def ablated(tmp_path_factory):
    """The planted model with its direction baked out (tests/find/directions/test_planted_direction.py)."""
    root = tmp_path_factory.mktemp("ablated")
    with pytest.MonkeyPatch.context() as patch:  # module scope: the per-test cache folder is not set yet
        patch.setenv("SURGERY_CACHE", str(root / "cache"))
        found = surgery.find_direction(FIXTURE, a=FIXTURE / "a.txt", b=FIXTURE / "b.txt", device="cpu")
        surgery.ablate_direction(FIXTURE, root / "out", direction=found.path, device="cpu")
    return root / "out"


def test_marker_rate_and_first_token_kl_of_an_ablation(ablated, tmp_path):
    (tmp_path / "markers.txt").write_text("NO\n")  # case-insensitive: the planted model answers "no"
    result = surgery.evaluate(
        ablated,
        against=FIXTURE,
        prompts=FIXTURE / "a.txt",
        markers=tmp_path / "markers.txt",
        suites=("kl", "markers"),
        limit=40,
        max_new_tokens=2,
        device="cpu",
    )
    before, after = result.metrics.against, result.metrics.model
    assert before["marker_rate"] == 1.0 and after["marker_rate"] == 0.0  # the trigger prompts' "no" is gone
    details = result.details.model
    assert details["markers"]["answers"] == 40 and details["markers"]["per_marker"] == {"NO": 0}
    first = details["kl"]["first_token"]
    assert set(first["per_language"]) == {"en", "es"} and first["n"] == 40
    assert after["first_token_kl_p99"] >= after["first_token_kl_p95"] >= 0.0
    assert "prompt" not in str(details["markers"])  # counts only: no prompt or answer is kept


def test_the_markers_suite_needs_both_files(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache"))
    line = error_line(run_main(["eval", FIXTURE, "--prompts", FIXTURE / "a.txt"], capsys))
    assert "the markers suite needs both --prompts FILE and --markers FILE" in line
    (tmp_path / "empty.txt").write_text("\n")
    line = error_line(
        run_main(["eval", FIXTURE, "--prompts", FIXTURE / "a.txt", "--markers", tmp_path / "empty.txt"], capsys)
    )
    assert "--markers:" in line and "holds no markers" in line
    (tmp_path / "latin1.txt").write_bytes("señal\n".encode("latin-1"))  # was an internal error, not one line
    line = error_line(
        run_main(["eval", FIXTURE, "--prompts", FIXTURE / "a.txt", "--markers", tmp_path / "latin1.txt"], capsys)
    )
    assert "--markers:" in line and "is not UTF-8 text" in line
    line = error_line(run_main(["eval", FIXTURE, "--prompts", FIXTURE / "a.txt", "--markers", tmp_path], capsys))
    assert "--markers:" in line and "is a folder" in line
