"""What ``surgery tune`` says: a held-out effect not shown above 0 is a note under its front, and what the
baseline passes will hold in memory is said before them."""

from __future__ import annotations

import pytest

from surgery.core.checkpoint import Checkpoint


def _record(tiny, ci: list[float]):
    from surgery.find.findings import ModelIdentity
    from surgery.find.tune.record import Chosen, HeldOutConfirmation, SplitSizes, Trial, TuneRecord

    return TuneRecord(
        method="direction",
        model=ModelIdentity.of(Checkpoint(tiny("llama"))),
        parameters={"trials": 1},
        study={"storage": "study.db", "sampler": "tpe", "seed": 0},
        objectives={"effect": "marker rate removed", "kl": "first-token KL"},
        split=SplitSizes(
            seed=0,
            test_share=0.5,
            tune_items=[],
            test_items=[],
            tune_pairs=4,
            test_pairs=4,
            tune_neutral=4,
            test_neutral=4,
        ),
        trials=[
            Trial(
                number=0,
                params={"weight": 0.8, "position": 1, "width": 1, "floor_share": 0.5, "modules": "mlp"},
                effect=0.25,
                kl=0.03,
            )
        ],
        front=[0],
        chosen=Chosen(number=0, rule="knee"),
        confirmation=HeldOutConfirmation(
            effect=sum(ci) / 2, effect_ci95=ci, kl=0.01, kl_ci95=[0.005, 0.02], rate_base=0.25, rate=0.5, items=4
        ),
    )


@pytest.mark.parametrize("ci, said", [([-0.75, 0.0], True), ([0.0, 0.5], True), ([0.25, 0.75], False)])
def test_a_held_out_effect_not_above_0_is_a_note(tiny, capsys, ci, said):
    """On SmolLM2 the chosen point measured -0.25 [-0.75, 0] held out (the marker rate rose) and was baked
    without a word; the guide says such an interval means the edit is not shown to work."""
    from surgery.cli.tune import print_tune

    print_tune(_record(tiny, ci))
    printed = capsys.readouterr()
    err = " ".join(printed.err.split())
    # the floor as the trial lines give it ("floor 0.50×"), not the weight it falls to (0.4)
    assert "│ 0.50× │" in printed.out and "0.4 " not in printed.out, printed.out
    assert ("is not shown to work on test prompts the search never saw" in err) == said, err


def test_what_the_recording_holds_is_said_before_it():
    """The default heads tune of SmolLM2 (1,856 binding prompts) recorded for 20 minutes on a 23 GB machine,
    then was killed; the guide's own sizes (30 layers, hidden 576, key/value width 192, float32) give 26.5 GiB."""
    from surgery.core.mcq import Encoded
    from surgery.find.tune.params import TuneParams
    from surgery.find.tune.runtime import held_note

    smollm2 = {"num_layers": 30, "hidden_size": 576, "num_kv_heads": 3, "head_dim": 64}
    prompts = [Encoded(tuple(range(60)), {})] * 384  # the guide: 7 MB a 60-token prompt, 2.7 GB for 384
    bound = TuneParams().keep_memory  # the default, 2 GiB
    line = held_note(prompts, smollm2, 4, "tune split", "lower --max-pairs", bound)
    assert line == (
        "the tune split's baseline passes would keep 384 prompts' decoder-layer inputs, keys and values: about "
        "2.47 GiB (23,040 tokens); they keep 2 GiB of them (--keep-memory) and the other prompts run every layer "
        "in each trial (slower): raise --keep-memory or lower --max-pairs to keep them all"
    )
    assert held_note([Encoded((1,) * 6, {})], smollm2, 4, "x", "y", bound) == (
        "the x's baseline passes keep 1 prompts' decoder-layer inputs, keys and values: about 675 KiB (6 tokens) "
        "in memory while it is measured (--keep-memory)"
    )
    # --keep-memory 3GiB holds the whole split
    larger = TuneParams(keep_memory="3GiB").keep_memory
    assert held_note(prompts, smollm2, 4, "tune split", "lower --max-pairs", larger).endswith(
        "while it is measured (--keep-memory)"
    )
