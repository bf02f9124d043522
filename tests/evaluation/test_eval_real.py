"""Real-model evaluation checks (slow): SmolLM2 on the shipped suite and on the shared BBQ subset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from surgery.evaluation.suites import evaluate, make_plan
from tests.support.paths import REPO

pytestmark = pytest.mark.slow(minutes=1)


def _shared_data() -> Path:
    env = os.environ.get("SURGERY_SHARED_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


def test_smollm2_retention_against_itself(smollm2):
    plan = make_plan(None, against=True, limit=40)
    r = evaluate(smollm2, plan, against=smollm2)
    m = r["metrics"]["model"]
    assert m["kl_mean"] == 0.0 and m["top1_agreement"] == 1.0
    assert r["retained_pct"] == {"perplexity": 100.0, "mcq_accuracy": 100.0}
    assert m["mcq_accuracy"] > r["details"]["model"]["mcq"]["chance"] + 0.1  # it knows something
    assert 1.0 < m["perplexity"] < 100.0


def test_smollm2_bbq_on_shared_data(smollm2):
    bbq = _shared_data() / "bbq"
    if not bbq.is_dir():
        pytest.skip(f"BBQ data not at {bbq}")
    r = evaluate(smollm2, make_plan(["bbq"], against=False, bbq=[bbq], limit=10))
    d = r["details"]["model"]["bbq"]
    assert d["n_ambig"] + d["n_disambig"] == 10 * len(list(bbq.glob("*.jsonl"))) and d["unresolved"] == 0
    assert all(-1.0 <= d[k] <= 1.0 for k in ("bias_ambig", "bias_disambig"))
