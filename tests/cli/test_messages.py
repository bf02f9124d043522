"""Messages a new user reads: a Python caller is told the keyword (``force=True``; a bake's switch as
``bake=surgery.BakeOptions(force=True)``), the command line the flag (``--force``); ``--heads``/``--neurons`` errors name the option and the edit as
typed; ``--transfer`` says which field differs; numpy numbers are numbers; ``--json`` errors are JSON
on stdout too; tables are never cut at 80 columns."""

from __future__ import annotations

import json

import numpy as np
import pytest
from rich.console import Console
from rich.table import Table

import surgery
from surgery.cli import console
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import HeadScale, Recipe
from surgery.core.errors import DestinationError, FindingsError, ParameterError, RecipeError, SurgeryError
from surgery.find.findings import Findings, check_model, model_identity
from surgery.find.heads.params import FindParams
from tests.support.cli import cli_env, error_line, run_here, run_main
from tests.support.tiny import build_tiny

# --- one message, spelled for each reader -------------------------------------------------------------


def test_a_message_names_keywords_in_python_and_flags_on_the_command_line():
    from surgery.cli.main import _for_the_command_line

    exc = DestinationError("/tmp/{x}/out exists; pass {force} or choose another {out}", "out", switches=("force",))
    assert str(exc) == "/tmp/{x}/out exists; pass force=True or choose another out"  # braces of a path stay
    assert _for_the_command_line(exc) == "/tmp/{x}/out exists; pass --force or choose another --out"
    plain = RecipeError("a {brace} but no names")
    assert str(plain) == _for_the_command_line(plain) == "a {brace} but no names"
    assert isinstance(exc, DestinationError) and exc.args == (str(exc),)


def test_force_is_a_bake_option_in_python_and_a_flag_on_the_command_line(tiny, tmp_path, capsys):
    model, out = tiny("llama"), tmp_path / "out"
    surgery.amplify_heads(model, out, heads="0.1", alpha=2.0, bake=surgery.BakeOptions(verify=False))
    with pytest.raises(DestinationError) as caught:
        surgery.amplify_heads(model, out, heads="0.1", alpha=3.0, bake=surgery.BakeOptions(verify=False))
    assert str(caught.value) == (
        f"{out} already exists; pass bake=surgery.BakeOptions(force=True) to replace it, or choose another out"
    )
    line = error_line(run_main(["amplify-heads", model, "--heads", "0.1", "--alpha", "3", "--out", out], capsys))
    assert line == f"Error: {out} already exists; pass --force to replace it, or choose another --out"


def test_force_of_an_undo_or_a_report_stays_a_keyword(tiny, tmp_path):
    """Only a bake's switches live in BakeOptions: undo takes ``force=True`` itself, and says so."""
    model, out, restored = tiny("llama"), tmp_path / "out", tmp_path / "restored"
    surgery.amplify_heads(model, out, heads="0.1", alpha=2.0, bake=surgery.BakeOptions(verify=False))
    surgery.undo(out, restored)
    with pytest.raises(DestinationError) as caught:
        surgery.undo(out, restored)
    assert "pass force=True" in str(caught.value) and "BakeOptions" not in str(caught.value)
    recipe = Recipe((HeadScale(0, 1, 2.0),))
    surgery.apply(recipe, model, tmp_path / "applied", bake=surgery.BakeOptions(verify=False))
    with pytest.raises(DestinationError, match=r"pass bake=surgery\.BakeOptions\(force=True\)"):
        surgery.apply(recipe, model, tmp_path / "applied")


def test_allow_other_base_is_a_bake_option_in_python(tiny, tmp_path):
    recipe = Recipe((HeadScale(0, 1, 2.0),), base_model="org/other-model")
    with pytest.raises(
        RecipeError, match=r"pass bake=surgery\.BakeOptions\(allow_other_base=True\) to bake it anyway"
    ) as caught:
        surgery.bake_recipe(tiny("llama"), recipe, tmp_path / "out")
    assert "--" not in str(caught.value)


def test_allow_zero_is_a_bake_option_in_python_and_a_flag_on_the_command_line(tiny, tmp_path, capsys):
    model = tiny("llama")
    with pytest.raises(
        ParameterError, match=r"pass bake=surgery\.BakeOptions\(allow_zero=True\) if that is what you want"
    ):
        surgery.amplify_heads(model, tmp_path / "a", heads="0.1", alpha=0)
    with pytest.raises(
        RecipeError, match=r"pass bake=surgery\.BakeOptions\(allow_zero=True\) if that is what you want"
    ):  # rounds to zero
        surgery.amplify_heads(model, tmp_path / "b", heads="0.1", alpha=1e-50)
    line = error_line(
        run_main(["amplify-heads", model, "--heads", "0.1", "--alpha", "1e-50", "--out", tmp_path / "c"], capsys)
    )
    assert "pass --allow-zero if that is what you want" in line


@pytest.mark.parametrize(
    "args, python, cli",
    [
        (  # the reported case: --confirm 2 with the default --knockout-heads 3
            ["--confirm", "2"],
            dict(confirm=2),
            "--confirm 2 confirms fewer heads than the 3 that --knockout-heads selects; "
            "give --confirm 0 (no confirmation) or at least 3",
        ),
        (
            ["--confirm", "4", "--knockout-heads", "5"],
            dict(confirm=4, knockout_heads=5),
            "--confirm 4 confirms fewer heads than the 5 that --knockout-heads selects; "
            "give --confirm 0 (no confirmation) or at least 5",
        ),
    ],
)
def test_confirm_below_knockout_heads(args, python, cli, tiny, tmp_path, capsys):
    with pytest.raises(ParameterError) as caught:
        FindParams(**python)
    assert str(caught.value) == cli.replace("--knockout-heads", "knockout_heads").replace("--confirm", "confirm")
    line = error_line(run_main(["find-heads", tiny("llama"), *args, "--out", tmp_path / "f.json"], capsys))
    assert line == f"Error: {cli}"
    assert not (tmp_path / "f.json").exists()


@pytest.mark.parametrize(
    "args, python, given, k",
    [
        (["--candidates", "2"], dict(candidates=2), 2, 3),
        (["--candidates", "3", "--knockout-heads", "4"], dict(candidates=3, knockout_heads=4), 3, 4),
    ],
)
def test_candidates_below_knockout_heads(args, python, given, k, tiny, tmp_path, capsys):
    cli = (
        f"--candidates {given} puts forward fewer heads than the {k} that --knockout-heads selects; "
        f"give --candidates at least {k}"
    )
    with pytest.raises(ParameterError) as caught:
        FindParams(**python)
    assert str(caught.value) == cli.replace("--knockout-heads", "knockout_heads").replace("--candidates", "candidates")
    line = error_line(run_main(["find-heads", tiny("llama"), *args, "--out", tmp_path / "f.json"], capsys))
    assert line == f"Error: {cli}"
    assert not (tmp_path / "f.json").exists()


# --- edits named on the command line are named as typed ------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["amplify-heads", "--heads", "9.9", "--alpha", "2"],
            "--heads 9.9: layer = 9 but the model has num_hidden_layers = 3",
        ),
        (
            ["amplify-heads", "--heads", "0.1,0.9", "--alpha", "2"],
            "--heads 0.9: head = 9 but the model has num_attention_heads = 4",
        ),
        (["prune-neurons", "--neurons", "0:999"], "--neurons 0:999: neuron = 999 but the model has intermediate_size"),
    ],
)
def test_an_edit_named_by_an_option_is_named_by_it(args, message, tiny, tmp_path, capsys):
    command, *rest = args
    line = error_line(run_main([command, tiny("llama"), *rest, "--out", tmp_path / "o"], capsys))
    assert line.startswith(f"Error: {message}") and "edits[" not in line, line


def test_an_edit_named_by_a_parameter_is_named_by_it_in_python(tiny, tmp_path):
    with pytest.raises(RecipeError, match=r"^heads 9\.9: layer = 9 but the model has num_hidden_layers = 3"):
        surgery.amplify_heads(tiny("llama"), tmp_path / "o", heads=[(9, 9)], alpha=2.0)
    # a recipe's edits keep their place in the file
    with pytest.raises(RecipeError, match=r"^edits\[0\]\.layer = 9"):
        surgery.bake_recipe(tiny("llama"), Recipe((HeadScale(9, 9, 2.0),)), tmp_path / "r")


@pytest.mark.parametrize(
    "neurons, message",
    [("1:x", "'1:x' is not LAYER:NEURON"), (" , ", "is empty; give LAYER:NEURON pairs")],
)
def test_a_neuron_string_is_named_by_the_parameter_in_python_and_the_flag_on_the_command_line(
    neurons, message, tiny, tmp_path, capsys
):
    model = tiny("llama")
    with pytest.raises(RecipeError) as caught:
        surgery.prune_neurons(model, tmp_path / "o", neurons=neurons)
    assert str(caught.value).startswith("neurons") and message in str(caught.value), caught.value
    assert "--" not in str(caught.value)
    line = error_line(run_main(["prune-neurons", model, "--neurons", neurons, "--out", tmp_path / "o"], capsys))
    assert line.startswith("Error: --neurons") and message in line, line


# --- numpy numbers are numbers --------------------------------------------------------------------------


def test_numpy_numbers_work_wherever_python_numbers_do(tiny, tmp_path):
    model = tiny("llama")
    layer, head = np.int64(0), np.int64(1)
    surgery.amplify_heads(
        model, tmp_path / "a", heads=[(layer, head)], alpha=np.float32(2.0), bake=surgery.BakeOptions(verify=False)
    )
    surgery.amplify_heads(
        model,
        tmp_path / "b",
        heads=[(0, 1)],
        alpha=[np.float64(2.0), np.int64(3)],
        bake=surgery.BakeOptions(verify=False),
    )
    surgery.bake_recipe(model, Recipe((HeadScale(layer, np.int32(2), np.float32(0.5)),)), tmp_path / "c")
    record = json.loads((tmp_path / "c" / "surgery.json").read_text())
    assert record["recipe"]["edits"] == [{"type": "head", "layer": 0, "head": 2, "alpha": 0.5}]
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["alpha-2", "alpha-3"]


# --- --transfer says which field differs ---------------------------------------------------------------


@pytest.mark.parametrize(
    "other, differs",
    [
        ({"num_layers": 24}, "num_layers 24 there, 3 here"),  # the reported case: same type, other geometry
        ({"num_heads": 8, "head_dim": 4}, "num_heads 8 there, 4 here; head_dim 4 there, 8 here"),
    ],
)
def test_transfer_to_another_geometry_says_which_field_differs(other, differs, tiny):
    ckpt = Checkpoint(tiny("llama"))
    identity = model_identity(ckpt)
    identity.update(fingerprint="0" * 64, path="/models/other", geometry={**identity["geometry"], **other})
    findings = Findings.from_dict(
        {"format": "surgery-findings", "version": 1, "kind": "heads", "model": identity}, kind="heads"
    )
    with pytest.raises(FindingsError) as caught:
        check_model(findings, ckpt, allow_transfer=True)
    assert f"even with transfer=True, because its architecture differs ({differs})" in str(caught.value)
    with pytest.raises(FindingsError, match="transfer") as without:
        check_model(findings, ckpt, allow_transfer=False)
    assert f"because its architecture differs ({differs})" in str(without.value)
    assert "even with" not in str(without.value)


# --- --json: an error is JSON on stdout too --------------------------------------------------------------


@pytest.mark.parametrize(
    "args, kind, message",
    [
        (["amplify-heads", "{model}", "--heads", "9.9", "--alpha", "2"], "RecipeError", "--heads 9.9: layer = 9"),
        (["amplify-heads", "{model}", "--heads", "0.1", "--alpha", "x"], "ParameterError", "--alpha: 'x'"),
        (["apply", "{tmp}/missing.yaml", "--model", "{model}"], "RecipeError", "does not exist"),
        (["inspect", "{tmp}/nowhere", "--json"], "CheckpointError", "does not exist"),
    ],
)
def test_json_errors_are_a_json_object_on_stdout(args, kind, message, tiny, tmp_path, capsys):
    model = tiny("llama")
    args = [a.format(model=model, tmp=tmp_path) for a in args]
    if "--json" not in args:
        args += ["--out", str(tmp_path / "out"), "--json"]
    result = run_main(args, capsys)
    line = error_line(result)
    assert json.loads(result.stdout) == {"error": line.removeprefix("Error: "), "type": kind}
    assert message in line and result.returncode == 2
    plain = run_main([a for a in args if a != "--json"], capsys)  # without --json: nothing on stdout
    assert plain.stdout == "" and error_line(plain) == line


def test_json_error_from_the_real_process(tiny, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("not surgery's")
    result = run_here(
        ["amplify-heads", tiny("llama"), "--heads", "0.1", "--alpha", "2", "--out", tmp_path / "taken", "--json"]
    )
    doc = json.loads(result.stdout)
    assert doc == {"error": error_line(result).removeprefix("Error: "), "type": "DestinationError"}
    assert "already exists; pass --force" in doc["error"] and result.returncode == 2


# --- tables are never cut short -------------------------------------------------------------------------


def _wide_table() -> Table:
    table = Table(title="Knockout confirmation")
    for col in ("head", "disc. rank", "coef", "reduction %", "95% CI", "signif.", "selected"):
        table.add_column(col, no_wrap=True)
    table.add_row("12.3", "1", "0.123456", "12.5", "[-0.123456, 0.345678]", "yes", "✓")
    return table


CELLS = ("head", "disc. rank", "reduction %", "signif.", "selected", "12.3", "0.123456", "[-0.123456, 0.345678]")


def test_a_table_in_a_pipe_is_as_wide_as_it_needs(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(console, "out", Console(highlight=False, soft_wrap=True))
    assert console.out.width == 80 and not console.out.is_terminal
    console.print_table(_wide_table())
    text = capsys.readouterr().out
    assert "…" not in text and all(cell in text for cell in CELLS), text


def _column_texts(lines: list[str]) -> list[str]:
    """Each column's text, its folded pieces joined across the header and body lines (spaces dropped)."""
    rows = [line for line in lines if line[:1] in "┃│"]
    width = len(rows[0].replace("┃", "│").split("│"))
    cells = [row.replace("┃", "│").split("│") for row in rows]
    return ["".join(cell[i] for cell in cells).replace(" ", "") for i in range(1, width - 1)]


def test_a_table_in_a_narrow_terminal_wraps_instead_of_cutting(monkeypatch, capsys):
    terminal = Console(highlight=False, force_terminal=True, width=80, color_system=None)
    monkeypatch.setattr(console, "out", terminal)
    console.print_table(_wide_table())
    lines = capsys.readouterr().out.splitlines()
    assert "…" not in "".join(lines) and max(len(line) for line in lines) <= 80
    header, cell = zip(*(c.split("|") for c in ("head|12.3", "disc.rank|1", "coef|0.123456", "reduction%|12.5")))
    texts = _column_texts(lines)
    assert texts[:4] == [h + c for h, c in zip(header, cell)], texts
    assert texts[4] == "95%CI[-0.123456,0.345678]"


def test_the_cli_prints_a_wide_table_whole_at_80_columns(tmp_path):
    model = build_tiny("llama", tmp_path / ("a-folder-with-a-long-name-" * 3) / "llama")
    result = run_here(["inspect", model], env=cli_env(COLUMNS="80"))
    assert result.returncode == 0, result.stderr
    assert max(map(len, result.stdout.splitlines())) > 80  # wider than COLUMNS, not cut to it
    assert "…" not in result.stdout and f"│ {model} │" in result.stdout.replace("  ", "")


def test_surgery_error_keeps_its_type_for_callers():
    assert issubclass(ParameterError, SurgeryError)
    assert str(ParameterError("{alpha} is empty", "alpha")) == "alpha is empty"


def test_an_error_raised_while_ctrl_c_unwinds_is_the_interruption(tiny, monkeypatch, capsys):
    """A Ctrl-C landing inside a lock's wait can make CPython raise "release unlocked lock" as the
    KeyboardInterrupt unwinds; the user pressed Ctrl-C, so that is what they are told (exit 130)."""
    import surgery.api

    def interrupted_in_a_wait(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        finally:
            raise RuntimeError("release unlocked lock")

    monkeypatch.setattr(surgery.api, "inspect", interrupted_in_a_wait)
    result = run_main(["inspect", tiny("llama")], capsys)
    assert result.returncode == 130, result.stderr
    assert "interrupted; nothing was left half-written" in result.stderr and "internal error" not in result.stderr
