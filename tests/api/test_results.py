"""What surgery.inspect and surgery.evaluate return: records read by attribute, whose ``to_dict()``
is what ``--json`` prints, key for key; reading them by key still works for one release, with a
warning."""

from __future__ import annotations

import json
import math

import pytest

import surgery
from surgery.api.results import EvalResult, ExportedLora, Inspection
from surgery.core.evaluation_result import clean, load_result
from tests.support.cli import run_main
from tests.support.tokenizer import TINY_VOCAB, save_char_tokenizer


@pytest.mark.parametrize("arch, extra", [("llama", {}), ("qwen2_moe", {"mlp_only_layers": [1]})])
def test_inspect_json_is_the_records_dict(arch, extra, tiny, capsys):
    model = tiny(arch, **extra)
    info = surgery.inspect(model)
    assert isinstance(info, Inspection) and info.supported and info.refused is None
    printed = run_main(["inspect", model, "--json"], capsys).stdout
    assert printed == json.dumps(info.to_dict(), indent=1, default=str) + "\n"
    facts = info.to_dict()
    assert list(facts)[:4] == ["path", "model_type", "supported", "layers"] and list(facts)[-1] == "layer_kinds"
    assert ("experts" in facts) == (arch == "qwen2_moe") and "refused" not in facts and "mla" not in facts
    assert facts["dtypes"] == ["F32"] and facts["layers"] == info.layers == 3


def test_reading_a_result_by_key_still_works_with_a_warning(tiny):
    info = surgery.inspect(tiny("llama"))
    with pytest.warns(DeprecationWarning, match=r"read the attribute \.heads \(or \.to_dict\(\)\['heads'\]\)"):
        assert info["heads"] == info.heads == 4
    with pytest.warns(DeprecationWarning), pytest.raises(KeyError):
        info["refused"]  # a fact the model does not have is absent, as it was from the dict


def _result(against: bool) -> dict:
    """A result JSON as surgery.evaluation.suites.evaluate builds it (a NaN metric included)."""
    measured = {"path": "/m", "fingerprint": "f1", "weights_sha256": {"model.safetensors": "ab"}}
    return {
        "format": "surgery-eval",
        "version": 1,
        "tool_version": surgery.__version__,
        "created": "2026-01-01T00:00:00+00:00",
        "model": measured,
        "against": {"path": "/s", "fingerprint": "f0", "weights_sha256": None, "from_cache": True} if against else None,
        "settings": {"limit": 2, "items": {"passages": 2}},
        "metrics": {
            "model": {"perplexity": 12.5, "kl_mean": math.nan},
            "against": {"perplexity": 12.0} if against else {},
        },
        "retained_pct": {"perplexity": 96.0} if against else {},
        "details": {"model": {"kl": {"first_token": [0.1]}}, "against": {}},
        "seconds": 3.2,
    }


@pytest.mark.parametrize("against", [False, True])
def test_eval_json_is_the_records_dict_byte_for_byte(against, tiny, tmp_path, capsys, monkeypatch):
    """eval --json prints the record's to_dict() exactly as it printed the result dict before."""
    from surgery.evaluation import suites

    result = _result(against)
    monkeypatch.setattr(suites, "evaluate", lambda *args, **kwargs: json.loads(json.dumps(result)))
    model = tiny("llama")
    args = ["eval", model, "--json"] + (["--against", model] if against else [])
    printed = run_main(args, capsys).stdout
    assert printed == json.dumps(clean(result), indent=1, default=str) + "\n"
    record = EvalResult.of(result)
    assert clean(record.to_dict()) == clean(result) and math.isnan(record.metrics.model["kl_mean"])
    assert list(record.to_dict()) == list(result) and list(record.to_dict()["model"]) == list(result["model"])
    assert (record.against is not None and record.against.from_cache) is against
    table = " ".join(run_main(["eval", model] + (["--against", model] if against else []), capsys).stdout.split())
    assert ("the source's results from the cache" in table) is against and ("96.0%" in table) is against
    assert "surgery eval: /m" in table and "3 s" in table


def test_evaluate_returns_the_result_it_writes(tiny, tmp_path):
    model = save_char_tokenizer(tiny("llama", vocab_size=TINY_VOCAB))
    result = surgery.evaluate(model, limit=1, out=tmp_path / "eval.json", device="cpu")
    assert isinstance(result, EvalResult) and result.against is None
    assert set(result.metrics.model) == {"perplexity", "mcq_accuracy"} and result.model.path == str(model)
    assert clean(result.to_dict()) == load_result(tmp_path / "eval.json")


def test_export_lora_json_is_the_results_dict_byte_for_byte(tiny, tmp_path, capsys):
    """export-lora --json prints the returned ExportedLora's to_dict(), the folder first; reading a
    field of the adapter record on the result still works, with a warning."""
    model, recipe = tiny("llama"), tmp_path / "recipe.yaml"
    recipe.write_text("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: 2.0}\n")
    exported = surgery.export_lora(model, recipe, tmp_path / "lora")
    assert isinstance(exported, ExportedLora) and exported.out == str(tmp_path / "lora")
    printed = run_main(["export-lora", model, "--recipe", recipe, "--out", tmp_path / "cli", "--json"], capsys).stdout
    cli = json.loads(printed)
    assert list(cli)[0] == "out" and cli["out"] == str(tmp_path / "cli")
    mine = {**exported.to_dict(), "out": cli["out"]}
    assert printed == json.dumps(mine, indent=1, default=str) + "\n"
    with pytest.warns(DeprecationWarning, match=r"read \.adapter\.modules"):
        assert exported.modules == exported.adapter.modules


def test_push_returns_the_record_push_json_prints():
    """push's result is the bake record's Pushed (with dry_run=True the PushPlan): its to_dict() is what
    push --json (push --dry-run --json) prints."""
    import inspect

    assert inspect.signature(surgery.push).return_annotation == "Pushed | PushPlan"
