"""What a GGUF bake refuses (one line, nothing written) and what --requantize does instead; the
commands end to end on a GGUF (bake, verify, undo)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from surgery.bake.gguf import bake_gguf
from surgery.bake.gguf_verify import undo_gguf, verify_gguf
from surgery.bake.provenance import sidecars
from surgery.core.edits import HeadScale, Recipe, parse_neurons
from surgery.core.errors import SurgeryError
from surgery.gguf.model import open_gguf
from tests.support.cli import run_main, staging_leftovers
from tests.support.directions import direction_recipe
from tests.support.typed_gguf import HIDDEN, write_typed_gguf


def refused(tmp_path, src, recipe, match, **kw) -> None:
    """Baking ``recipe`` into ``src`` fails with one line matching ``match``, leaving nothing behind."""
    model = open_gguf(src)  # its config goes to the cache (a folder of tmp_path too)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SurgeryError, match=match) as info:
        bake_gguf(model, recipe, tmp_path / "out.gguf", **kw)
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not staging_leftovers(tmp_path)


def test_unsupported_type_of_an_edited_tensor(tmp_path):
    src = tmp_path / "src.gguf"
    # IQ1_M packs its scale across bit fields: no f16 field carries an edit.
    write_typed_gguf(src, "Q8_0", types={"blk.0.ffn_gate.weight": "IQ1_M"})
    refused(tmp_path, src, Recipe(tuple(parse_neurons("0:3", 0.0))), r"blk\.0\.ffn_gate\.weight is stored as IQ1_M")


def test_truncated_file(tmp_path):
    src = tmp_path / "src.gguf"
    write_typed_gguf(src, "Q4_0")
    with open(src, "r+b") as f:
        f.truncate(src.stat().st_size - 1000)
    with pytest.raises(SurgeryError, match="is truncated: tensor .* download it again") as info:
        open_gguf(src)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "arch, match", [("mamba", "model_type 'mamba' is not supported"), ("rwkv6", "'rwkv6' GGUF, which transformers")]
)
def test_architecture_not_in_the_table(tmp_path, arch, match):
    src = tmp_path / "src.gguf"
    write_typed_gguf(src, "Q4_0", arch=arch)
    with pytest.raises(SurgeryError, match=match) as info:
        open_gguf(src)
    assert "\n" not in str(info.value)


def test_part_of_a_k_quant_super_block_is_refused_even_with_requantize(tmp_path):
    src = tmp_path / "src.gguf"
    write_typed_gguf(src, "Q4_K", heads=4, head_dim=64)  # a head is 64 of a row's 256-value super-block
    recipe = Recipe((HeadScale(0, 1, 2.0),))
    # head_dim is the model's: "whole blocks" is no choice the user has, importing the GGUF is
    said = r"Q4_K\): a head's α \(on its head_dim columns of each row\) scales part of a 256-value block, .*; "
    fix = r"gguf-py cannot requantize Q4_K: import the GGUF \(surgery import-gguf\) and bake the checkpoint$"
    refused(tmp_path, src, recipe, said + fix)
    refused(tmp_path, src, recipe, said + fix, requantize=True)


def test_a_direction_edit_is_refused_not_skipped(tmp_path):
    """A projection rewrites whole matrices: no block scale carries it, so the bake refuses (it once
    planned no block at all and wrote an unedited copy)."""
    src = tmp_path / "src.gguf"
    write_typed_gguf(src, "F32")
    recipe = Recipe.load(direction_recipe(tmp_path / "r", ["layer: 0, module: mlp, weight: 1"], hidden=HIDDEN))
    refused(tmp_path, src, recipe, "a direction edit rewrites whole matrices")


def test_a_steer_edit_is_refused(tmp_path):
    """A steer edit adds to a bias (a sum, not a scale): refused before its bias is even looked for."""
    src = tmp_path / "src.gguf"
    write_typed_gguf(src, "F32")
    entry = ["layer: 0, module: mlp, weight: 1"]
    recipe = Recipe.load(direction_recipe(tmp_path / "r", entry, hidden=HIDDEN, kind="steer"))
    refused(tmp_path, src, recipe, "a steer edit adds a vector to biases, which a GGUF block")


@pytest.mark.parametrize(
    "kind, fix",
    [
        ("Q4_1", "add --requantize, prune the neuron instead"),
        ("Q8_0", "add --requantize, prune the neuron instead"),
        ("Q4_K", "gguf-py cannot requantize Q4_K: prune the neuron instead"),
    ],
)
def test_a_neuron_scaled_not_pruned_needs_its_down_column_alone(kind, fix, tmp_path):
    """A neuron's down column is one value of a block in every row, whatever neurons the user picks:
    the refusal offers what fits a neuron (not "edit whole blocks")."""
    src = tmp_path / "src.gguf"
    write_typed_gguf(src, kind)
    said = r"blk\.0\.ffn_down\.weight \(" + kind + r"\): a neuron's factor other than 0 \(on its down-projection column"
    rest = r" \(factor 0 is exact\), or import the GGUF \(surgery import-gguf\) and bake the checkpoint$"
    refused(
        tmp_path,
        src,
        Recipe(tuple(parse_neurons("0:3", 0.5))),
        said + r".* part of a \d+-value block, .*; " + fix + rest,
    )


def test_inexact_alpha_is_refused_then_requantized_with_its_error_recorded(tmp_path):
    src, out = tmp_path / "src.gguf", tmp_path / "out.gguf"
    write_typed_gguf(src, "Q4_0", heads=4, head_dim=64)
    recipe = Recipe((HeadScale(1, 2, 0.7),))
    # the factor named (a recipe scales many tensors): it was "the factor times the blocks' scales …"
    refused(
        tmp_path, src, recipe, r"blk\.1\.attn_output\.weight \(Q4_0\): the factor 0\.7 .* not exact .* --requantize"
    )
    result = bake_gguf(open_gguf(src), recipe, out, requantize=True)
    (row,) = result.provenance.extra["gguf"]["tensors"]
    assert row["requantized_blocks"] > 0 and 0 < row["max_abs_error"] < 0.1 and 0 < row["rel_rms_error"] < 0.2
    record = json.loads(sidecars(out)[0].read_text())
    assert record["gguf"]["tensors"][0]["max_abs_error"] == row["max_abs_error"]
    assert verify_gguf(out, src).ok
    undo_gguf(out, tmp_path / "restored.gguf")
    assert (tmp_path / "restored.gguf").read_bytes() == src.read_bytes()


def test_destinations(tmp_path):
    src, out = tmp_path / "src.gguf", tmp_path / "out.gguf"
    write_typed_gguf(src, "Q8_0")
    model, recipe = open_gguf(src), Recipe((HeadScale(0, 1, 2.0),))
    with pytest.raises(SurgeryError, match=r"must end in \.gguf"):
        bake_gguf(model, recipe, tmp_path / "out")
    with pytest.raises(SurgeryError, match="is the source .*; the source is never written: choose another file$"):
        bake_gguf(model, recipe, src, force=True)  # not "a folder outside it": a file has no outside
    bake_gguf(model, recipe, out)
    with pytest.raises(SurgeryError, match=r"already exists; pass force=True to replace it, or choose another out$"):
        bake_gguf(model, recipe, out)
    bake_gguf(model, Recipe((HeadScale(0, 0, 2.0),)), out, force=True)  # a bake's own output: replaced
    assert verify_gguf(out, src).ok
    other = tmp_path / "other.gguf"
    other.write_bytes(b"not ours")
    with pytest.raises(SurgeryError, match="was not written by surgery"):
        bake_gguf(model, recipe, other, force=True)
    assert other.read_bytes() == b"not ours"
    # undo --force over another bake's output replaces it and removes its now stale sidecars
    taken = tmp_path / "taken.gguf"
    bake_gguf(model, recipe, taken)
    with pytest.raises(SurgeryError, match="already exists"):
        undo_gguf(out, taken)
    undo_gguf(out, taken, force=True)
    assert taken.read_bytes() == src.read_bytes()
    assert not any(p.exists() for p in sidecars(taken))
    undo_gguf(out, taken, force=True)  # an earlier restore is replaceable too
    with pytest.raises(SurgeryError, match=r"must end in \.gguf"):
        undo_gguf(out, tmp_path / "restored")
    report = verify_gguf(out, tmp_path / "missing.gguf")
    assert not report.ok and "is not a file" in report.problems[0]


def test_commands_end_to_end(tmp_path, capsys):
    src, out, back = tmp_path / "src.gguf", tmp_path / "pruned.gguf", tmp_path / "back.gguf"
    write_typed_gguf(src, "Q4_1")
    done = run_main(["prune-neurons", src, "--neurons", "0:3,1:7", "--out", out, "--json"], capsys)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["tensors_edited"] == 4 and summary["verification"]["max_abs_diff"] == 0.0
    assert "left as is" in " ".join(summary["notes"])  # Q4_1's down columns, and why
    assert run_main(["verify", src, out], capsys).returncode == 0
    swapped = run_main(["verify", out, src], capsys)
    assert swapped.returncode != 0 and swapped.stderr.strip().splitlines() == [
        f"Error: {out} was made by surgery and {src} was not: the source comes first: surgery verify SOURCE BAKED"
    ], swapped.stderr
    assert run_main(["undo", out, "--out", back], capsys).returncode == 0
    assert back.read_bytes() == src.read_bytes()
    failed = run_main(["amplify-heads", src, "--heads", "0.1", "--alpha", "0.7", "--out", tmp_path / "h.gguf"], capsys)
    assert failed.returncode != 0
    errors = [ln for ln in failed.stderr.splitlines() if ln.startswith("Error: ")]
    assert len(errors) == 1 and "--requantize" in errors[0]
    assert not (tmp_path / "h.gguf").exists()
    done = run_main(
        ["amplify-heads", src, "--heads", "0.1", "--alpha", "0.7", "--requantize", "--out", tmp_path / "h.gguf"], capsys
    )
    assert done.returncode == 0, done.stderr
    assert np.isfinite(json.loads(sidecars(tmp_path / "h.gguf")[0].read_text())["verification"]["max_abs_diff"])
