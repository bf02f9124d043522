"""A bake's loose parameters in small typed objects: ``callbacks=Callbacks(...)`` (the flat keywords
of before warn and keep their meaning), ``source=FindingsSource(...)`` and ``data=EvalData(...)``
(their fields may still be given flat, like every option object's), and no public function taking
more than a dozen parameters."""

from __future__ import annotations

import inspect
import warnings

import pytest

import surgery
from surgery import api
from surgery.core.errors import ParameterError

MOST_PARAMETERS = 12


def test_no_public_function_takes_more_than_a_dozen_parameters():
    counts = {
        name: len([p for p in inspect.signature(obj).parameters.values() if p.kind is not p.VAR_KEYWORD])
        for name in api.__all__
        if inspect.isfunction(obj := getattr(api, name))
    }
    assert counts["prune_neurons"] > 0
    assert {name: n for name, n in counts.items() if n > MOST_PARAMETERS} == {}


def test_callbacks_hear_the_plans_and_each_output(tiny, tmp_path):
    seen = []
    hooks = api.Callbacks(on_plans=lambda plans: seen.append(len(plans)), on_each=lambda label, b: seen.append(label))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new form warns about nothing
        surgery.amplify_heads(
            tiny("llama"),
            tmp_path / "o",
            heads="0.1",
            alpha=[2.0, 3.0],
            bake=api.BakeOptions(verify=False),
            callbacks=hooks,
        )
    assert seen == [2, "alpha-2", "alpha-3"]


def test_the_old_callback_keywords_still_work_with_a_warning_naming_the_new_form(tiny, tmp_path):
    seen = []
    with pytest.warns(DeprecationWarning) as caught:
        surgery.prune_neurons(
            tiny("llama"), tmp_path / "o", neurons="1:3", bake=api.BakeOptions(verify=False), on_plans=seen.append
        )
    assert len(seen) == 1 and seen[0][0].recipe.edits
    (warning,) = caught
    assert str(warning.message) == (
        "prune_neurons(on_plans=…) is deprecated and will be removed in the next release; "
        "write prune_neurons(…, callbacks=surgery.Callbacks(on_plans=…)) instead"
    )
    assert warning.filename == __file__  # it points at the caller's line


def test_callbacks_and_their_old_keywords_together_are_refused(tiny, tmp_path):
    with pytest.raises(TypeError, match=r"give either a Callbacks or its options \(report\), not both"):
        surgery.amplify_heads(
            tiny("llama"), tmp_path / "o", heads="0.1", alpha=2.0, callbacks=api.Callbacks(), report=print
        )


def test_findings_source_flat_or_as_one_object_says_the_same(tiny, tmp_path):
    """transfer without a findings file is refused in either spelling, before anything runs."""
    for given in ({"transfer": True}, {"source": api.FindingsSource(transfer=True)}):
        with pytest.raises(
            ParameterError, match="transfer applies to findings from another checkpoint; give findings FILE"
        ):
            surgery.prune_neurons(tiny("llama"), tmp_path / "o", n=2, **given)
    with pytest.raises(TypeError, match=r"give either a FindingsSource or its options \(recompute\), not both"):
        surgery.neuron_findings(tiny("llama"), source=api.FindingsSource(), recompute=True)


def test_eval_data_refuses_an_unknown_option_naming_its_fields():
    with pytest.raises(TypeError, match=r"evaluate\(\) got unknown option bqq; it also takes: .*\bbbq\b"):
        surgery.evaluate("no-such-model", bqq=["x.jsonl"])
