"""One object for a bake's switches: ``bake=surgery.BakeOptions(...)`` in Python, built by the command
line from its flags in one place; the flat keywords of before still work, with a warning that says
what to write instead."""

from __future__ import annotations

import inspect
import json
import warnings

import pytest

import surgery
from surgery import api
from surgery.api.bake_options import FIELDS, BakeOptions
from surgery.core.errors import SurgeryError
from tests.support.cli import error_line, run_main

# Public functions whose own force= is not a bake's: undo, report, export_lora and import_gguf write
# other things than a baked checkpoint.
NOT_BAKES = {"undo", "report", "export_lora", "import_gguf", "write_card", "push"}


def _bake_bytes(folder) -> dict[str, bytes]:
    """Every file of a bake but surgery.json (whose creation time differs), and surgery.json's recipe."""
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "surgery.json"}
    return {**files, "recipe": json.dumps(json.loads((folder / "surgery.json").read_text())["recipe"]).encode()}


def test_the_old_keywords_bake_the_same_with_a_warning_naming_the_new_form(tiny, tmp_path):
    model = tiny("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new form warns about nothing
        surgery.amplify_heads(model, tmp_path / "new", heads="0.1", alpha=2.0, bake=BakeOptions(verify=False))
    with pytest.warns(DeprecationWarning) as caught:
        surgery.amplify_heads(model, tmp_path / "old", heads="0.1", alpha=2.0, verify=False)
    assert _bake_bytes(tmp_path / "new") == _bake_bytes(tmp_path / "old")
    (warning,) = caught
    assert str(warning.message) == (
        "amplify_heads(verify=…) is deprecated and will be removed in the next release; "
        "write amplify_heads(…, bake=surgery.BakeOptions(verify=False)) instead"
    )
    assert warning.filename == __file__  # it points at the caller's line, not at surgery's


def test_old_keywords_of_apply_and_prune_neurons_keep_their_meaning(tiny, tmp_path):
    """force=True still replaces a bake, allow_zero=True still lets a scale round to zero."""
    model = tiny("llama")
    recipe = surgery.Recipe((surgery.HeadScale(0, 1, 2.0),))
    surgery.apply(recipe, model, tmp_path / "out", bake=BakeOptions(verify=False))
    with pytest.warns(
        DeprecationWarning, match=r"apply\(force=…, verify=…\) .*BakeOptions\(force=True, verify=False\)"
    ):
        surgery.apply(recipe, model, tmp_path / "out", force=True, verify=False)
    with pytest.warns(DeprecationWarning, match=r"bake=surgery.BakeOptions\(allow_zero=True\)"):
        surgery.prune_neurons(model, tmp_path / "tiny", neurons="1:3", factor=1e-50, allow_zero=True)
    assert (tmp_path / "tiny" / "surgery.json").is_file()


def test_options_and_their_old_keywords_together_are_refused(tiny, tmp_path):
    with pytest.raises(TypeError, match=r"give either a BakeOptions or its options \(force\), not both"):
        surgery.amplify_heads(tiny("llama"), tmp_path / "o", heads="0.1", alpha=2.0, bake=BakeOptions(), force=True)
    assert not (tmp_path / "o").exists()


def test_no_public_bake_takes_a_switch_of_its_own():
    """Every bake switch comes in BakeOptions: no public function that bakes names one itself."""
    bakes = [name for name in api.__all__ if callable(getattr(api, name)) and name not in NOT_BAKES]
    for name in bakes:
        if isinstance(getattr(api, name), type):
            continue  # the records: Baked, Planned, BakeOptions …
        own = set(inspect.signature(getattr(api, name)).parameters) & set(FIELDS)
        assert not own, f"{name} takes {sorted(own)} itself; they belong in BakeOptions"


@pytest.mark.parametrize("given", [False, True])
def test_the_command_line_builds_the_options_from_its_flags(given, tiny, tmp_path, capsys, monkeypatch):
    """amplify-heads, prune-neurons, ablate-direction and apply hand the library one BakeOptions of
    the flags each has (apply has no --requantize, ablate-direction no --allow-zero)."""
    seen = {}

    def record(name):
        def call(*args, bake, **kwargs):
            seen[name] = bake
            raise SurgeryError("recorded")  # the command ends here: nothing to print

        return call

    for name in ("amplify_heads", "prune_neurons", "ablate_direction", "apply"):
        monkeypatch.setattr(api, name, record(name))
    model, out = tiny("llama"), tmp_path / "out"
    runs = {  # each command's required options, then the bake flags it has besides the common ones
        "amplify_heads": (["amplify-heads", model, "--heads", "0.1", "--alpha", "2"], ["--allow-zero", "--requantize"]),
        "prune_neurons": (["prune-neurons", model, "--neurons", "0:1"], ["--allow-zero", "--requantize"]),
        "ablate_direction": (["ablate-direction", model, "--direction", tmp_path / "d.json"], ["--requantize"]),
        "apply": (["apply", tmp_path / "r.yaml", "--model", model], ["--allow-zero", "--allow-other-base"]),
    }
    common = ["--force", "--no-verify", "--push-to", "me/x", "--private"]
    for name, (required, own) in runs.items():
        flags = own + common if given else []
        assert error_line(run_main([*required, "--out", out, *flags], capsys)) == "Error: recorded"
        assert seen[name] == BakeOptions(
            force=given,
            verify=not given,
            allow_zero="--allow-zero" in flags,
            allow_other_base="--allow-other-base" in flags,
            requantize="--requantize" in flags,
            push_to="me/x" if given else None,
            private=given,
        ), name
