"""The lm-eval adapter: a clear message without the package; a real run on a local task with it."""

from __future__ import annotations

import json
import re
import sys

import pytest

from surgery.core.errors import SurgeryError
from surgery.core.optional import pip_install
from surgery.evaluation.lmeval import run_lm_eval
from surgery.model.loading import load_model
from tests.support.tokenizer import TINY_VOCAB, char_tokenizer

TASK = """task: surgery_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
doc_to_choice: "{{{{choices}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def test_absent_package_names_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(SurgeryError, match=re.escape(pip_install("lmeval"))):
        run_lm_eval(object(), object(), ["arc_easy"])


def test_local_task_runs_offline(tiny, tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    data = tmp_path / "data.jsonl"
    rows = [
        {"question": q, "choices": c, "answer": a}
        for q, c, a in [("2+2?", ["4", "5", "6", "7"], 0), ("Sky?", ["red", "blue", "green", "black"], 1)]
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "task.yaml").write_text(TASK.format(data=data))
    model = load_model(tiny("llama", vocab_size=TINY_VOCAB))
    r = run_lm_eval(model, char_tokenizer(), ["surgery_tiny_mc"], include_path=tmp_path / "tasks", batch_size=2)
    assert set(r["metrics"]) == {"lm_eval/surgery_tiny_mc/acc"}
    assert r["metrics"]["lm_eval/surgery_tiny_mc/acc"] in (0.0, 0.5, 1.0)
    with pytest.raises(SurgeryError, match="does not know the task"):
        run_lm_eval(model, char_tokenizer(), ["no_such_task_xyz"], include_path=tmp_path / "tasks")
