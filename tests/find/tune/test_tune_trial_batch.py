"""Direction trials measured together (find.tune.trial_batch) give each trial what it gets measured alone:
the same marker hits on every prompt, the first-token KLs to float tolerance (a product of more rows
may sum in another order); on the planted direction model and on SmolLM2 (its chat template's shared
prefix, edits from the embeddings' layer to the top, replays below the lowest one). The search draws
TPE's random start-up trials together exactly as one at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from surgery.core.optional import available, install_hint
from tests.support.planted_tune import DIRECTION, refusal_marker

pytestmark = pytest.mark.skipif(not available("optuna"), reason=install_hint("optuna"))


def _lines(path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _same_as_alone(trials, edit_sets) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each edit set measured alone and all together: the same hits, KLs within float tolerance."""
    from surgery.find.tune.trial_batch import batchable

    assert batchable(trials.model, edit_sets)  # the stacked path runs, not its fallback
    alone = [trials.measure(edits) for edits in edit_sets]
    together = trials.measure_many(edit_sets)
    for (hits, kl), (hits_t, kl_t) in zip(alone, together):
        assert hits.tolist() == hits_t.tolist()
        np.testing.assert_allclose(kl_t, kl, rtol=1e-4, atol=1e-7)
    return alone


def test_planted_trials_measured_together_get_their_own_numbers(tmp_path):
    import surgery
    from surgery.core.architectures import architecture
    from surgery.core.checkpoint import Checkpoint
    from surgery.find.directions.find import DirectionFindings
    from surgery.find.tune.direction import DirectionTrials, recipe_of
    from surgery.find.tune.params import TuneParams
    from surgery.model.loading import load_model, load_tokenizer

    torch.set_num_threads(1)
    ckpt = Checkpoint(DIRECTION)
    found = DirectionFindings.read(
        surgery.find_direction(DIRECTION, a=str(DIRECTION / "a.txt"), b=str(DIRECTION / "b.txt")).path, ckpt
    )
    markers = _lines(refusal_marker(tmp_path / "markers.txt"))
    params = TuneParams(method="direction", max_new_tokens=3, batch_size=4)
    model, tokenizer = load_model(DIRECTION), load_tokenizer(DIRECTION)
    trials = DirectionTrials(
        model, tokenizer, _lines(DIRECTION / "a.txt")[:8], _lines(DIRECTION / "neutral.txt")[:8], params, markers
    )
    arch = architecture(ckpt.config)
    points = [  # the planted optimum, a weight too small to matter, one writer, the top layer alone
        {"weight": 1.0, "position": 0, "width": 1, "floor_share": 1.0, "modules": "attention,mlp"},
        {"weight": 0.05, "position": 0, "width": 1, "floor_share": 0.0, "modules": "attention,mlp"},
        {"weight": 1.2, "position": 1, "width": 1, "floor_share": 0.3, "modules": "mlp"},
        {"weight": 0.7, "position": 1, "width": 1, "floor_share": 0.0, "modules": "attention"},
    ]
    alone = _same_as_alone(trials, [recipe_of(p, found, arch)[0].edits for p in points])
    # the rows were told apart: the optimum removes every marker, the small weight leaves some
    assert trials.base.all() and alone[0][0].sum() == 0 and alone[1][0].sum() > 0


@pytest.mark.slow(minutes=3)
def test_smollm2_trials_measured_together_get_their_own_numbers(smollm2):
    from surgery.core.direction_edit import DirectionEdit
    from surgery.find.tune.direction import DirectionTrials
    from surgery.find.tune.params import TuneParams
    from surgery.model.loading import load_model, load_tokenizer
    from tests.support.paths import REPO

    torch.set_num_threads(1)
    tokenizer, model = load_tokenizer(smollm2), load_model(smollm2)
    folder = REPO / "examples" / "directions"
    prompts, neutral = _lines(folder / "es_questions.txt")[:8], _lines(folder / "en_questions.txt")[:8]
    params = TuneParams(method="direction", max_new_tokens=16, batch_size=8)
    trials = DirectionTrials(model, tokenizer, prompts, neutral, params, _lines(folder / "spanish_letters.txt"))
    assert trials.prefix and 0 < trials.base.sum() < len(prompts)  # a shared prefix; hits to lose and gain
    rng = np.random.default_rng(0)
    edit_sets = []
    for first, weight, modules in ((0, 6.0, ("attention", "mlp")), (12, 8.0, ("mlp",)), (27, 20.0, ("attention",))):
        unit = rng.standard_normal(model.config.hidden_size).astype(np.float32)
        unit = (unit / np.linalg.norm(unit)).tobytes()
        edit_sets.append(
            [
                DirectionEdit(module=m, vector="r.safetensors#r", weight=weight, layer=layer, unit=unit)
                for layer in range(first, model.config.num_hidden_layers)
                for m in modules
            ]
        )
    alone = _same_as_alone(trials, edit_sets)
    assert len({tuple(hits.tolist()) for hits, _ in alone}) > 1 or len({round(kl.mean(), 6) for _, kl in alone}) > 1


def test_start_up_trials_drawn_together_are_the_ones_drawn_one_at_a_time(tmp_path):
    from surgery.find.tune.study import TPE_STARTUP, Study
    from tests.support.tune_study import KEY, draw, drawn, measure, run

    whole = Study(tmp_path / "whole", KEY, "tpe", seed=3)
    run(whole, TPE_STARTUP + 4)
    together = Study(tmp_path / "together", KEY, "tpe", seed=3)
    assert together.together(TPE_STARTUP + 4) == TPE_STARTUP
    together.run_many(TPE_STARTUP, draw, lambda points: [measure(p) for p in points])
    assert together.together(4) == 1  # TPE's model-based trials: one at a time, as before
    run(together, TPE_STARTUP + 4)
    assert drawn(together) == drawn(whole)


def test_trials_at_once_draws_the_model_based_trials_together(tmp_path):
    from surgery.find.tune.study import TPE_STARTUP, Study
    from tests.support.tune_study import KEY, draw, drawn, measure

    whole = Study(tmp_path / "whole", KEY, "tpe", seed=3)
    batched = Study(tmp_path / "batched", KEY, "tpe", seed=3, at_once=4)
    for study in (whole, batched):
        while len(study.finished()) < TPE_STARTUP + 8:
            study.run_many(
                study.together(TPE_STARTUP + 8 - len(study.finished())), draw, lambda ps: [measure(p) for p in ps]
            )
    assert drawn(batched)[:TPE_STARTUP] == drawn(whole)[:TPE_STARTUP]  # the random start-up: the same draws
    later = [t.params for t in batched.finished()[TPE_STARTUP:]]
    assert len({tuple(sorted(p.items())) for p in later}) == len(later)  # the liar keeps a batch's draws apart
    assert all(t.user_attrs["measured_with"] == 4 for t in batched.finished()[TPE_STARTUP:])


def test_trials_at_once_is_a_direction_tpe_option_and_keys_the_study_only_when_used():
    from surgery.core.errors import ParameterError
    from surgery.find.tune.params import TuneParams

    with pytest.raises(ParameterError, match="trials_at_once"):
        TuneParams(method="heads", trials_at_once=4)
    with pytest.raises(ParameterError, match="trials_at_once"):
        TuneParams(method="direction", sampler="nsga2", trials_at_once=4)
    assert "trials_at_once" not in TuneParams(method="direction").study_key()  # older studies resume
    assert TuneParams(method="direction", trials_at_once=4).study_key()["trials_at_once"] == 4


def test_start_up_trials_cut_short_together_are_drawn_again_the_same(tmp_path):
    from surgery.find.tune.study import TPE_STARTUP, Study
    from tests.support.tune_study import KEY, draw, drawn, measure, run

    whole = Study(tmp_path / "whole", KEY, "tpe", seed=3)
    run(whole, TPE_STARTUP + 2)

    def interrupted(points):
        raise KeyboardInterrupt  # Ctrl-C inside the batch

    killed = Study(tmp_path / "killed", KEY, "tpe", seed=3)
    with pytest.raises(KeyboardInterrupt):
        killed.run_many(TPE_STARTUP, draw, interrupted)
    resumed = Study(tmp_path / "killed", KEY, "tpe", seed=3)
    assert resumed.finished() == [] and len(resumed.study.trials) == TPE_STARTUP  # all failed
    resumed.run_many(resumed.together(TPE_STARTUP + 2), draw, lambda points: [measure(p) for p in points])
    run(resumed, TPE_STARTUP + 2)
    assert drawn(resumed) == drawn(whole)
