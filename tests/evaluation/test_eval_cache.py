"""The fast eval gives the naive numbers, and the source's results come back from the cache.

The reference is tests/support/naive_eval.py: one item per forward pass, full log-softmax. The
cache (surgery.evaluation.source_cache) must give the source's numbers exactly as measured, and
must not be trusted when the source's weights change or an entry is damaged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from surgery.bake.bake import bake
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import HeadScale, Recipe
from surgery.evaluation import lm, suites
from surgery.evaluation.data import retention_data
from surgery.model.loading import load_model, load_tokenizer
from tests.support import naive_eval as naive
from tests.support.tokenizer import TINY_VOCAB, char_tokenizer, save_char_tokenizer

RTOL = 1e-5
# A KL between near-equal distributions sums differences of log-probabilities of ~10 nats: their
# float rounding (float32's 1.2e-7 relative, so ~1e-6 nats, different in a batch of another shape)
# passes into it whole, so its tolerance is absolute, not relative to the KL's own small size. Measured:
# within 1e-7 on Intel Xeons, 3.5e-7 on an AVX-512 AMD EPYC (the p95 of 0.0013 nats).
KL_ATOL = 1e-6
LIMIT = 6
# a sliding window shorter than the contexts, a logit soft-cap, a multimodal wrapper, fused q/k/v,
# and mixtures of experts (GPT-OSS: attention sinks): the key/value cache must serve them all
ARCHS = ["llama", "mistral", "gemma2", "gemma3", "phi3", "qwen2_moe", "gpt_oss"]


@pytest.fixture
def pair(tiny, tmp_path, monkeypatch):
    """A tiny source with the character tokenizer, a baked edit of it, and an empty cache."""
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache"))
    src = save_char_tokenizer(tiny("llama", vocab_size=TINY_VOCAB, max_position_embeddings=512))
    baked = tmp_path / "baked"
    bake(Checkpoint(src), Recipe((HeadScale(1, 2, 3.0),)), baked)
    return src, baked


def _evaluate(model: Path, source: Path, **kw) -> dict:
    plan = suites.make_plan(None, against=True, limit=LIMIT, batch_size=4)
    return suites.evaluate(model, plan, against=source, **kw)


def _numbers(result: dict) -> dict:
    """Everything measured (both models' metrics and details, the retained %)."""
    return {k: result[k] for k in ("metrics", "details", "retained_pct")}


def _entry(tmp_path: Path) -> tuple[Path, Path]:
    (json_path,) = (tmp_path / "cache" / "eval").glob("*.json")
    return json_path, json_path.with_suffix(".safetensors")


@pytest.mark.parametrize("arch", ARCHS)
def test_option_logliks_equal_the_joined_sequence(tiny, arch):
    model, tok = load_model(tiny(arch, vocab_size=TINY_VOCAB)), char_tokenizer()
    ctx = ["Question: which river runs to the sea?\nAnswer:", "Question: why?\nAnswer:", "Q: no space"]
    pairs = [(c, o) for c in ctx for o in [" the Nile", " x", " a very long answer here", ""]]
    got = lm.option_logliks(model, tok, pairs, batch_size=2)
    want = [naive.option_loglik(model, tok, c, o) for c, o in pairs]
    assert got == pytest.approx(want, rel=RTOL, abs=1e-6)
    assert got[3] == 0.0  # an empty answer has no tokens to score


def test_eval_numbers_equal_the_naive_evaluation(pair):
    src, baked = pair
    result = _evaluate(baked, src)
    data = retention_data(LIMIT)
    want = naive.retention_and_kl(load_model(baked), load_model(src), load_tokenizer(src), data)
    got = {f"{who}/{k}": v for who in ("model", "against") for k, v in result["metrics"][who].items()}
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=RTOL, abs=KL_ATOL if "kl" in key else 0), key
    # the options' log-likelihoods behind the accuracy, one by one
    model, tok = load_model(baked), load_tokenizer(baked)
    _, scores = naive.mcq(model, tok, data["mcq"])
    pairs = [(f"Question: {q['question']}\nAnswer:", f" {c}") for q in data["mcq"] for c in q["choices"]]
    assert lm.option_logliks(model, tok, pairs, batch_size=3) == pytest.approx(sum(scores, []), rel=RTOL)


def test_second_call_takes_the_source_from_the_cache(pair, tmp_path, monkeypatch):
    src, baked = pair
    first = _evaluate(baked, src)
    loaded = []
    real_load = suites._load
    monkeypatch.setattr(suites, "_load", lambda path, load: loaded.append(Path(path)) or real_load(path, load))
    second = _evaluate(baked, src)
    assert not first["against"]["from_cache"] and second["against"]["from_cache"]
    assert loaded == [baked]  # the source was not loaded at all
    assert _numbers(second) == _numbers(first)  # exactly: KL against the cached log-probs too
    again = _evaluate(baked, src, recompute=True)
    assert not again["against"]["from_cache"] and loaded == [baked, src, baked]
    assert _numbers(again) == _numbers(first)
    assert len(list((tmp_path / "cache" / "eval").iterdir())) == 2  # one entry: its JSON and tensors


def test_changed_source_weights_are_measured_again(pair, tmp_path):
    src, baked = pair
    first = _evaluate(baked, src)
    weights = src / "model.safetensors"
    tensors = load_file(weights)
    name = next(n for n in tensors if n.endswith("mlp.down_proj.weight"))
    tensors[name] = tensors[name] * 1.5
    save_file(tensors, weights, metadata={"format": "pt"})
    second = _evaluate(baked, src)
    assert not second["against"]["from_cache"]
    assert second["metrics"]["against"]["perplexity"] != first["metrics"]["against"]["perplexity"]


@pytest.mark.parametrize(
    "damage", ["tensors truncated", "tensors flipped", "json truncated", "number changed", "tensors missing"]
)
def test_damaged_cache_entry_is_measured_again(pair, tmp_path, damage):
    src, baked = pair
    first = _evaluate(baked, src)
    json_path, tensors_path = _entry(tmp_path)
    if damage == "tensors truncated":
        tensors_path.write_bytes(tensors_path.read_bytes()[:1000])
    elif damage == "tensors flipped":
        raw = bytearray(tensors_path.read_bytes())
        raw[-5] ^= 0xFF
        tensors_path.write_bytes(bytes(raw))
    elif damage == "json truncated":
        json_path.write_text(json_path.read_text()[:200])
    elif damage == "number changed":
        entry = json.loads(json_path.read_text())
        entry["metrics"]["perplexity"] *= 0.5
        json_path.write_text(json.dumps(entry))
    else:
        tensors_path.unlink()
    second = _evaluate(baked, src)
    assert not second["against"]["from_cache"]
    assert _numbers(second) == _numbers(first)
    third = _evaluate(baked, src)  # the entry was rewritten whole
    assert third["against"]["from_cache"] and _numbers(third) == _numbers(first)


def test_reference_log_probs_are_stored_exactly(pair, tmp_path):
    src, baked = pair
    _evaluate(baked, src)
    _, tensors_path = _entry(tmp_path)
    stored = load_file(tensors_path)
    prompts = [p["text"] for p in retention_data(LIMIT)["prompts"]]
    fresh = lm.next_token_logprobs(load_model(src), load_tokenizer(src), prompts)
    assert len(stored) == len(prompts)
    for i, t in enumerate(fresh):
        assert stored[f"prompt.{i}"].dtype == torch.float32 and torch.equal(stored[f"prompt.{i}"], t)


def test_cli_says_where_the_source_came_from_and_recomputes_on_request(pair):
    from click.testing import CliRunner

    from surgery.cli.main import cli

    src, baked = pair

    def run(*extra: str) -> dict:
        r = CliRunner().invoke(
            cli, ["eval", str(baked), "--against", str(src), "--limit", "2", "--json", *extra], catch_exceptions=False
        )
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    cold, warm, again = run(), run(), run("--recompute")
    assert [x["against"]["from_cache"] for x in (cold, warm, again)] == [False, True, False]
    assert _numbers(cold) == _numbers(warm) == _numbers(again)


def test_cache_keeps_the_most_recently_used_entries_within_its_limit(tmp_path):
    """prune: least recently used entries go first, whole (JSON and tensors); the entry just written
    stays even when it alone passes the limit; an old tensors file without its JSON is litter."""
    import os
    import time

    from surgery.evaluation import source_cache

    folder, now = tmp_path / "eval", time.time()
    folder.mkdir()
    for age, name in ((40, "old"), (30, "mid"), (20, "new"), (10, "newest")):
        (folder / f"{name}.json").write_text("{}")
        (folder / f"{name}.safetensors").write_bytes(b"x" * 1000)
        for suffix in (".json", ".safetensors"):
            os.utime(folder / f"{name}{suffix}", (now - age, now - age))
    (folder / "orphan.safetensors").write_bytes(b"x" * 10)
    os.utime(folder / "orphan.safetensors", (now - 2 * source_cache.ORPHAN_SECONDS,) * 2)
    (folder / "writing.safetensors").write_bytes(b"x" * 10)  # its JSON is about to come
    dropped = source_cache.prune(folder, keep=folder / "newest.json", limit=2100)
    assert [p.name for p in dropped] == ["old.json", "mid.json"]
    assert sorted(p.name for p in folder.iterdir()) == [
        "new.json",
        "new.safetensors",
        "newest.json",
        "newest.safetensors",
        "writing.safetensors",
    ]
    assert [p.name for p in source_cache.prune(folder, keep=folder / "new.json", limit=0)] == ["newest.json"]


def test_reading_an_entry_marks_it_used(pair, tmp_path):
    import os

    src, baked = pair
    _evaluate(baked, src)
    json_path, _ = _entry(tmp_path)
    os.utime(json_path, (1, 1))
    assert _evaluate(baked, src)["against"]["from_cache"]
    assert json_path.stat().st_mtime > 1


def test_a_missing_number_is_null_in_the_entry_and_read_back_as_nan(tmp_path):
    """A mean over no items is NaN: the entry holds null (strict JSON), and it reads back as NaN, as
    an entry written before (NaN in the file) still does: the cached source is the measured one."""
    import math

    from surgery.evaluation import source_cache
    from tests.support.strict_json import strict

    json_path, tensors_path, key = tmp_path / "e.json", tmp_path / "e.safetensors", {"fingerprint": "f", "limit": None}
    metrics = {"perplexity": 3.5, "mcq_accuracy": math.nan}
    details = {"mcq": {"accuracy": math.nan, "n": 0}, "kl": {"first_token": {"mean": math.nan, "n": 0}}}
    source_cache.write(json_path, tensors_path, key, source_cache.SourceRun(metrics, details, None, False), 0)
    entry = strict(json_path.read_text())  # raises on NaN
    assert entry["metrics"]["mcq_accuracy"] is None and entry["details"]["mcq"]["accuracy"] is None

    def read() -> source_cache.SourceRun:
        run = source_cache.read(json_path, tensors_path, key, 0)
        assert run is not None and run.from_cache
        assert run.metrics["perplexity"] == 3.5 and math.isnan(run.metrics["mcq_accuracy"])
        assert math.isnan(run.details["kl"]["first_token"]["mean"]) and run.details["mcq"]["n"] == 0
        return run

    read()
    # the entry as surgery wrote it before: NaN in the file, its hash over that text
    old = {**entry, "metrics": metrics, "details": details}
    old["sha256"] = source_cache._content_sha256(old)
    json_path.write_text(json.dumps(old, indent=1) + "\n")
    assert "NaN" in json_path.read_text()
    read()
