"""Integrity: verify catches any flipped byte in any output file; random recipes and edits round-trip."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from surgery.bake.bake import bake
from surgery.bake.provenance import PROVENANCE_NAME
from surgery.bake.undo import undo
from surgery.bake.verify import structural
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import SurgeryError
from tests.support.cli import run_here, run_main, tree_hashes
from tests.support.tiny import build_tiny

MASKS = (0x01, 0x20, 0x80, 0xFF)


@pytest.fixture(scope="module")
def baked(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny sharded llama and its bake through the real CLI (card, provenance, undo data)."""
    root = tmp_path_factory.mktemp("integrity")
    src = build_tiny("llama", root / "src", shard="20KB")
    out = root / "baked"
    result = run_here(["amplify-heads", src, "--heads", "0.1,2.3", "--alpha", "2.5", "--out", out, "--no-verify"])
    assert result.returncode == 0, result.stderr
    return src, out


def _detected(src: Path, out: Path) -> bool:
    """True when verify reports a problem or refuses the folder outright."""
    try:
        report, _ = structural(Checkpoint(src), out)
    except SurgeryError:
        return True
    return not report.ok


def _positions(size: int, rng: random.Random, n: int) -> list[int]:
    """First, last, middle and ``n`` random offsets of a file."""
    return sorted({0, size - 1, size // 2, *(rng.randrange(size) for _ in range(n))})


def test_every_output_file_is_covered(baked):
    src, out = baked
    names = sorted(tree_hashes(out))
    assert {"README.md", PROVENANCE_NAME, "surgery.undo", "config.json"} <= set(names)
    assert not _detected(src, out), "the untouched bake must verify"


def test_any_flipped_byte_is_detected(baked):
    """Every output file, at its ends, middle and random offsets, with several bit masks."""
    src, out = baked
    rng = random.Random(0)
    tried = 0
    for name in sorted(tree_hashes(out)):
        path = out / name
        original = path.read_bytes()
        # surgery.json has no recorded sha256 of its own: probe it much more densely.
        for i, pos in enumerate(_positions(len(original), rng, 60 if name == PROVENANCE_NAME else 8)):
            data = bytearray(original)
            data[pos] ^= MASKS[i % len(MASKS)]
            path.write_bytes(bytes(data))
            try:
                assert _detected(src, out), f"flipping byte {pos} of {name} went unnoticed"
            finally:
                path.write_bytes(original)
            tried += 1
    assert tried > 100 and not _detected(src, out)


def test_verify_cli_fails_on_a_flipped_byte_in_each_file(baked, capsys):
    """``surgery verify`` itself: a real subprocess on the intact folder, then one flip per file
    through surgery.cli.main.main in-process (the same code without an interpreter start per file)."""
    src, out = baked
    assert run_here(["verify", src, out, "--structural-only"]).returncode == 0
    for name in sorted(tree_hashes(out)):
        path = out / name
        original = path.read_bytes()
        data = bytearray(original)
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        try:
            result = run_main(["verify", src, out, "--structural-only"], capsys)
        finally:
            path.write_bytes(original)
        assert result.returncode != 0, f"verify passed with a flipped byte in {name}"
        assert "Traceback" not in result.stderr
        assert any(ln.startswith(("FAIL: ", "Error: ")) for ln in result.stderr.splitlines()), result.stderr


# --- property-based round trips ----------------------------------------------------------------

_scale = st.floats(allow_nan=False, allow_infinity=False, width=32) | st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5])
_text = st.text(max_size=20)


# Scales a bake accepts on any dtype (larger ones overflow F16 and are refused: test_bad_input).
_bake_scale = st.floats(-1e3, 1e3, width=32) | st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5])


def _edits(layers: int, heads: int, width: int, max_size: int, scale=_scale):
    """Edits with distinct targets (a recipe refuses two scales for one head or neuron)."""
    target = st.tuples(
        st.sampled_from(["head", "neuron"]), st.integers(0, layers - 1), st.integers(0, max(heads, width) - 1)
    ).filter(lambda t: t[0] == "neuron" or t[2] < heads)
    return st.dictionaries(target, scale, min_size=1, max_size=max_size).map(
        lambda d: tuple(HeadScale(l, i, s) if k == "head" else NeuronScale(l, i, s) for (k, l, i), s in d.items())
    )


@settings(max_examples=60, deadline=None)
@given(
    edits=_edits(200, 64, 20000, 12),
    base=st.none() | _text,
    notes=st.dictionaries(_text, _text | st.integers() | st.booleans(), max_size=3),
    header=_text,
)
def test_recipe_yaml_round_trip(edits, base, notes, header):
    recipe = Recipe(edits, base, notes=notes)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "recipe.yaml"
        path.write_text(recipe.to_yaml(header), encoding="utf-8")
        loaded = Recipe.load(path)
    assert loaded == recipe
    assert [str(e.scale) for e in loaded.edits] == [str(e.scale) for e in recipe.edits]  # -0.0 stays -0.0


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("roundtrip")
    return {
        "llama-f32-sharded": build_tiny("llama", root / "llama", shard="20KB"),
        "phi3-bf16": build_tiny("phi3", root / "phi3", dtype=torch.bfloat16),
    }


# Both tiny models have 3 layers, 4 heads and an MLP width of 48 (BASE in tests/support/tiny.py).
@pytest.mark.parametrize("name", ["llama-f32-sharded", "phi3-bf16"])
@settings(max_examples=10, deadline=None)
@given(edits=_edits(3, 4, 48, 6, _bake_scale))
def test_random_edits_bake_verify_undo(name, sources, edits):
    """bake → structural verify → undo gives the source back byte for byte, for random edits."""
    src = sources[name]
    with tempfile.TemporaryDirectory() as tmp:
        out, restored = Path(tmp) / "baked", Path(tmp) / "restored"
        bake(Checkpoint(src), Recipe(edits), out, allow_zero=True)  # a subnormal scale may round to 0
        report, _ = structural(Checkpoint(src), out)
        assert report.ok, report.problems
        undo(out, restored)
        assert tree_hashes(restored) == tree_hashes(src)


def test_undo_reads_a_baked_folder_under_version_control(tmp_path):
    """A baked folder cloned from the Hub or made a git repository to push it holds .git (and a Hub
    download .cache): not the model's files. undo restores the source as without them (they are not
    "added after the bake"), and leaves them out of the source it writes."""
    src = build_tiny("llama", tmp_path / "src")
    out = tmp_path / "baked"
    bake(Checkpoint(src), Recipe((HeadScale(0, 1, 2.0),)), out)
    for extra in (".git/HEAD", ".git/objects/ab/cdef", ".cache/huggingface/download/model.safetensors.lock"):
        (out / extra).parent.mkdir(parents=True, exist_ok=True)
        (out / extra).write_text("not the model's\n")
    undo(out, tmp_path / "restored")
    assert tree_hashes(tmp_path / "restored") == tree_hashes(src)


@pytest.mark.parametrize("change", ["edited", "removed"])
def test_undo_restores_the_source_after_the_card_is_edited_by_hand(tmp_path, change):
    """The card (README.md) is the bake's, and undo writes the source's own in its place: a card a user
    edited (before a push) or removed was "changed after the bake; undo would not give the source"
    (or "recorded but missing"). A source with a card of its own gets it back."""
    src = build_tiny("llama", tmp_path / "src")
    (src / "README.md").write_text("# the source's own card\n")
    out = tmp_path / "baked"
    bake(Checkpoint(src), Recipe((HeadScale(0, 1, 2.0),)), out, card=lambda folder, record: "# the bake's card\n")
    card = out / "README.md"
    card.write_text(card.read_text() + "\nMy notes.\n") if change == "edited" else card.unlink()
    undo(out, tmp_path / "restored")
    assert tree_hashes(tmp_path / "restored") == tree_hashes(src)


def test_undo_of_changed_weights_says_what_to_do(tmp_path):
    src = build_tiny("llama", tmp_path / "src")
    out = tmp_path / "baked"
    bake(Checkpoint(src), Recipe((HeadScale(0, 1, 2.0),)), out)
    (out / "config.json").write_text((out / "config.json").read_text().replace("{", "{\n", 1))
    with pytest.raises(SurgeryError, match="changed after the bake; undo would not give the source: put the file back"):
        undo(out, tmp_path / "restored")
    assert not (tmp_path / "restored").exists()


def test_verify_json_says_which_numeric_check_ran(baked, tmp_path, capsys):
    """`--json`'s numeric_check said "logits" after --structural-only (no model loaded) and for a baked
    GGUF (no model runs: its blocks are recomputed)."""
    import json

    from surgery.bake.gguf import bake_gguf
    from surgery.gguf.model import open_gguf
    from tests.support.typed_gguf import write_typed_gguf

    src, out = baked
    result = run_main(["verify", src, out, "--structural-only", "--json"], capsys)
    assert json.loads(result.stdout)["numeric_check"] == "none (structural only: no model loaded)"
    gguf, edited = tmp_path / "src.gguf", tmp_path / "edited.gguf"
    write_typed_gguf(gguf, "Q8_0")
    bake_gguf(open_gguf(gguf), Recipe((HeadScale(0, 1, 2.0),)), edited)
    result = run_main(["verify", gguf, edited, "--json"], capsys)
    assert json.loads(result.stdout)["numeric_check"].startswith("GGUF blocks: every edited block recomputed")
