"""Proof on the dosed planted-binding model (tests/fixtures/binding_dose): one layer-0 head carries the
binding, and whole-head α on it scales ΔS while leaving neutral prompts alone, so the planted
optimum of the heads' space is that head alone at a large α. Its findings rank brute force's six
best heads (tests/support/planted_tune.py), the search may take up to three of them.

The criterion: every front point scales the dosed head alone (any other head adds KL and no
binding), the front reaches α in the top quarter of the range, and the chosen point, re-measured on
held-out items, raises |ΔS| with a 95% CI above 0. A trial's run-time measurement (resumed from the
recorded passes) equals a full pass with the scales hooked in; the bad inputs are one line each.
"""

from __future__ import annotations

import pytest

from surgery.core.errors import ParameterError
from surgery.core.optional import available, install_hint
from tests.support.planted_tune import BENCHMARK, DOSE, dosed_head, neutral_prompts, truth_findings

pytestmark = pytest.mark.skipif(not available("optuna"), reason=install_hint("optuna"))

TRIALS = 14
ALPHA = (1.0, 4.0)
# Options of every run here: a few pairs per identity, one thread (a tiny model on a shared CPU).
OPTIONS = {"benchmark": str(BENCHMARK), "max_pairs": 96, "batch_size": 64, "top_max": 3, "trials": TRIALS}
SAME = 1e-5  # S of a resumed pass against a full pass (float summation order)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("tune")
    return truth_findings(tmp / "findings.json"), neutral_prompts(tmp / "neutral.jsonl"), tmp


@pytest.fixture(scope="module")
def tuned(files):
    import surgery

    findings, neutral, tmp = files
    lines: list[str] = []
    result = surgery.tune(
        DOSE, findings=findings, out=tmp / "study", neutral=str(neutral), report=lines.append, **OPTIONS
    )
    return result, lines


def test_the_front_holds_the_planted_optimum(tuned):
    record = tuned[0].record
    assert len(record.trials) == TRIALS and record.front
    front = [record.trial(n) for n in record.front]
    assert all(t.heads == [list(dosed_head())] for t in front), [(t.heads, t.params) for t in front]
    assert max(t.params["alpha"] for t in front) >= ALPHA[1] - (ALPHA[1] - ALPHA[0]) / 4
    assert all(t.effect > 0 for t in front)  # α > 1 on the binding head grows |ΔS|


def test_the_chosen_point_recovers_the_planted_effect_on_held_out_items(tuned):
    record = tuned[0].record
    chosen, c = record.trial(record.chosen.number), record.confirmation
    assert chosen.heads == [list(dosed_head())] and record.chosen.rule == "knee"
    assert c.effect_ci95[0] > 0 and abs(c.delta_s) > abs(c.delta_s_base), c
    assert set(record.split.test_items).isdisjoint(record.split.tune_items)
    assert c.items == len(record.split.test_items) and c.neutral == record.split.test_neutral


def test_progress_says_each_trial_and_the_best_so_far(tuned):
    lines = tuned[1]
    trial_lines = [line for line in lines if line.startswith("trial ")]
    assert len(trial_lines) == TRIALS and all("best so far: trial " in line for line in trial_lines)


def test_a_trial_equals_a_full_pass_with_the_scales_hooked_in(files):
    """The resumed run-time passes of a trial give the S and the last-position log-probabilities of
    full passes of the model with the same scales applied (model.hooks.applied)."""
    import torch

    from surgery.core.edits import HeadScale
    from surgery.core.mcq import Encoded
    from surgery.find.heads.benchmark import load_benchmark
    from surgery.find.heads.pairs import build_pairs
    from surgery.find.heads.prompts import collate
    from surgery.find.heads.scores import SPAN_NAMES, encode_pairs, option_token_ids, s_scores
    from surgery.find.tune.heads_eval import HeadTrials, last_logprobs
    from surgery.model.hooks import applied
    from surgery.model.loading import load_model, load_tokenizer

    tok, model = load_tokenizer(DOSE), load_model(DOSE)
    pairs = build_pairs(load_benchmark(str(BENCHMARK)), seed=0, max_pairs=8)
    binding = encode_pairs(tok, pairs, "binding", False)
    neutral = [Encoded(tuple(tok(t)["input_ids"]), {}) for t in ["the volmi is", "who wears the dorter"]]
    ids = option_token_ids(tok)
    trials = HeadTrials.of(model, binding, neutral, ids, batch_size=4)
    scales = (HeadScale(*dosed_head(), 2.5), HeadScale(2, 5, 0.5))
    s, _ = trials.measure(scales)
    with applied(model, scales), torch.inference_mode():
        full = collate(binding, range(len(binding)), 0, SPAN_NAMES)
        logits = model(**full.model_inputs()).logits[:, -1].float().log_softmax(-1)
        plain = collate(neutral, range(2), 0, ())
        neutral_full = model(**plain.model_inputs()).logits[:, -1].float().log_softmax(-1)
    assert (torch.from_numpy(s) - s_scores(logits, ids).double()).abs().max() < SAME
    # last_logprobs gives the rows in the recorded batches' order
    assert (last_logprobs(model, trials.neutral, scales) - neutral_full[trials.neutral.mine]).abs().max() < SAME


def test_recordings_past_the_bound_run_in_full_with_the_same_numbers():
    """A split whose recordings pass find-heads' bound (the default heads tune of SmolLM2 needs 26.5 GiB)
    keeps only what fits; the batches past it run every layer under each trial's edit and measure the
    same S and KL as resumed ones, holding only their inputs."""
    from surgery.core.edits import HeadScale
    from surgery.core.mcq import Encoded
    from surgery.find.heads.benchmark import load_benchmark
    from surgery.find.heads.pairs import build_pairs
    from surgery.find.heads.scores import encode_pairs, option_token_ids
    from surgery.find.tune.heads_eval import HeadTrials
    from surgery.find.tune.runtime import Keep
    from surgery.model.loading import load_model, load_tokenizer

    tok, model = load_tokenizer(DOSE), load_model(DOSE)
    binding = encode_pairs(tok, build_pairs(load_benchmark(str(BENCHMARK)), seed=0, max_pairs=8), "binding", False)
    neutral = [Encoded(tuple(tok(t)["input_ids"]), {}) for t in ["the volmi is", "who wears the dorter"]]
    ids = option_token_ids(tok)
    everything = HeadTrials.of(model, binding, neutral, ids, batch_size=4)
    first = everything.binding.batches[0][1].nbytes()
    scales = (HeadScale(*dosed_head(), 2.5), HeadScale(2, 5, 0.5))
    s, kl = everything.measure(scales)
    for bound in (0, first):  # nothing kept; the first batch kept, the rest past the bound
        keep = Keep(bound)
        bounded = HeadTrials.of(model, binding, neutral, ids, batch_size=4, keep=keep)
        snaps = [snap for r in (bounded.binding, bounded.neutral) for _, snap in r.batches]
        assert keep.in_full == len(binding) + len(neutral) - (4 if bound else 0)
        assert sum(snap.nbytes() for snap in snaps if snap.calls) <= bound
        light = [snap for snap in snaps if not snap.calls]
        assert all(not snap.keys and not snap.values and snap.final.untyped_storage().nbytes() == 0 for snap in light)
        s2, kl2 = bounded.measure(scales)
        assert abs(s2 - s).max() < SAME and abs(kl2 - kl).max() < SAME
        assert (bounded.binding_base == everything.binding_base).all()


def test_bad_inputs_are_one_line_each(files, tuned):
    import surgery

    findings, neutral, tmp = files
    common = {**OPTIONS, "findings": findings, "neutral": str(neutral)}
    with pytest.raises(ParameterError, match=r"^the test split is empty: \d+ items split with test_share 0;"):
        surgery.tune(DOSE, out=tmp / "empty", **{**common, "test_share": 0.0})
    least = min(t.kl for t in tuned[0].record.trials)
    with pytest.raises(ParameterError, match=rf"the smallest KL reached was {least:.4g} \(trial \d+\)"):
        surgery.tune(DOSE, out=tmp / "study", **{**common, "max_kl": least / 2})  # resumes: no trial runs again
    with pytest.raises(
        ParameterError, match=r"^no heads findings for .*: run surgery find-heads first, or give findings FILE"
    ):
        surgery.tune(DOSE, out=tmp / "none", **{**OPTIONS, "neutral": str(neutral)})


def test_without_out_the_study_lives_in_the_cache_and_resumes(files, tmp_path, monkeypatch):
    import surgery

    findings, neutral, _ = files
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "cache"))
    options = {**OPTIONS, "trials": 2, "max_pairs": 32, "findings": findings, "neutral": str(neutral)}
    first = surgery.tune(DOSE, **options)
    assert first.path.parent.parent == tmp_path / "cache" / "tune" and first.path.is_file()
    lines: list[str] = []
    again = surgery.tune(DOSE, report=lines.append, **options)
    assert again.path == first.path and again.record.trials == first.record.trials
    # besides what each split's recording holds (said before its passes), the study resumed with nothing to run
    study = [line for line in lines if "baseline passes keep" not in line]
    assert study == [f"resuming the study in {first.path.parent}: 2 of 2 trials done"], lines
