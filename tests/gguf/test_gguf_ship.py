"""Shipping baked GGUFs: push (the file, its sidecars and a card, in one commit, to a loopback fake
Hub) and sweeps over α into one .gguf per value (exact, verifying, reproducible, all or nothing)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from surgery.bake.gguf import bake_gguf
from surgery.bake.gguf_verify import verify_gguf
from surgery.bake.provenance import sidecars
from surgery.core.checkpoint import file_sha256
from surgery.core.edits import HeadScale, Recipe, parse_neurons
from surgery.core.errors import VerificationError
from surgery.gguf.model import open_gguf
from surgery.ship.hub import checked_uploads
from tests.support.cli import run_main, staging_leftovers
from tests.support.fakehub import TOKEN, FakeHub, card_front_matter, hub_env, run_surgery
from tests.support.typed_gguf import tensor_values, write_typed_gguf

HEAD_DIM = 256


@pytest.fixture
def baked(tmp_path):
    """A Q4_1 GGUF with two neurons pruned (their down columns left as is: a note) and a head doubled."""
    src, out = tmp_path / "src.gguf", tmp_path / "edited.gguf"
    write_typed_gguf(src, "Q4_1", head_dim=HEAD_DIM)
    recipe = Recipe(tuple(parse_neurons("0:3,1:7", 0.0)) + (HeadScale(1, 0, 2.0),))
    bake_gguf(open_gguf(src), recipe, out, extra={"selection": {"alpha": 2.0}})
    return src, out


def commits(hub: FakeHub, repo: str) -> list[str]:
    return [q for q in hub.requests if q.startswith(f"POST /api/models/{repo}/commit/")]


def test_push_uploads_the_file_its_sidecars_and_a_card_in_one_commit(baked, tmp_path):
    src, out = baked
    record_path, undo_path = sidecars(out)
    with FakeHub(TOKEN) as hub:
        r = run_surgery(["push", out, "--repo", "me/edited-gguf", "--private"], hub_env(hub, tmp_path))
        assert r.returncode == 0, r.stderr
        files = hub.files("me/edited-gguf")
        assert len(commits(hub, "me/edited-gguf")) == 1 and hub.repos["me/edited-gguf"].private
    assert sorted(files) == sorted(["README.md", out.name, record_path.name, undo_path.name])
    for path in (out, record_path, undo_path):
        assert files[path.name] == path.read_bytes(), path.name
    record = json.loads(files[record_path.name])
    assert record["files"][out.name] == file_sha256(out)  # the uploaded bytes are the recorded ones
    assert record["files"][undo_path.name] == file_sha256(undo_path)

    card = files["README.md"].decode()
    meta = card_front_matter(card)
    assert {"surgery", "gguf"} <= set(meta["tags"]) and "base_model" not in meta  # a local file: no Hub id
    assert f"sha256 `{file_sha256(src)}`" in card and "src.gguf" in card and str(tmp_path) not in card
    for tensor in ("blk.0.ffn_gate.weight", "blk.1.ffn_up.weight", "blk.1.attn_output.weight"):
        assert f"| `{tensor}` | Q4_1 |" in card
    assert "left as is" in card  # Q4_1's down columns, the plan's note
    assert "- **selection**" in card and "- **gguf**" not in card  # findings in Why; blocks in their own section
    assert f"surgery undo {out.name} --out src.gguf" in card and "HeadScale" not in card
    assert "Checked: sidecars' seal and sha256s" in r.stdout and f"compared with {src}" in r.stdout
    assert TOKEN not in r.stdout + r.stderr


def test_the_card_records_requantization_errors(tmp_path):
    src, out = tmp_path / "src.gguf", tmp_path / "h.gguf"
    write_typed_gguf(src, "Q4_0", head_dim=HEAD_DIM)
    bake_gguf(open_gguf(src), Recipe((HeadScale(0, 1, 0.7),)), out, requantize=True)
    tensor = json.loads(sidecars(out)[0].read_text())["gguf"]["tensors"][0]
    card = checked_uploads(out)[1]["README.md"].decode()
    assert tensor["requantized_blocks"] > 0
    assert (
        f"| `blk.0.attn_output.weight` | Q4_0 | {tensor['blocks']} | {tensor['requantized_blocks']} | "
        f"{tensor['max_abs_error']:.3g} | {tensor['rel_rms_error']:.3g} |"
    ) in card
    assert f"--out {out.name} --requantize`" in card


def test_apply_takes_requantize_and_the_cards_command_bakes_the_same_file(tmp_path, capsys):
    """The card's `surgery apply recipe.yaml … --requantize` (and gguf.md's --requantize on every baking
    command) was "No such option: --requantize": apply had none."""
    src, out = tmp_path / "src.gguf", tmp_path / "h.gguf"
    write_typed_gguf(src, "Q4_0", head_dim=HEAD_DIM)
    recipe = Recipe((HeadScale(0, 1, 0.7),))
    bake_gguf(open_gguf(src), recipe, out, requantize=True)
    (tmp_path / "recipe.yaml").write_text(recipe.to_yaml())
    command = checked_uploads(out)[1]["README.md"].decode().split("`surgery apply ", 1)[1].split("`", 1)[0].split()
    again = tmp_path / "again"
    again.mkdir()
    args = [tmp_path / a if a in ("recipe.yaml", src.name) else again / a if a == out.name else a for a in command]
    result = run_main(["apply", *args], capsys)
    assert result.returncode == 0, result.stderr
    assert file_sha256(again / out.name) == file_sha256(out)


def test_a_changed_file_is_refused_before_any_request(baked, tmp_path):
    src, out = baked
    data = bytearray(out.read_bytes())
    data[-3] ^= 0x10
    out.write_bytes(bytes(data))
    with FakeHub(TOKEN) as hub:
        r = run_surgery(["push", out, "--repo", "me/bad"], hub_env(hub, tmp_path))
        assert hub.requests == [] and not hub.repos
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("Error: ")]
    assert r.returncode == 2 and len(errors) == 1 and "refusing to push" in errors[0]
    with pytest.raises(VerificationError, match="no sidecar src.gguf.surgery.json: it was not made by a surgery bake"):
        checked_uploads(src)  # a GGUF that no bake wrote
    src.rename(tmp_path / "moved-away.gguf")  # without the source: the recorded sha256s still catch it
    with pytest.raises(VerificationError, match="changed after the bake"):
        checked_uploads(out)


def test_bake_with_push_to(tmp_path):
    src, out = tmp_path / "src.gguf", tmp_path / "pruned.gguf"
    write_typed_gguf(src, "Q8_0")
    with FakeHub(TOKEN) as hub:
        r = run_surgery(
            ["prune-neurons", src, "--neurons", "0:3", "--out", out, "--push-to", "me/pruned"], hub_env(hub, tmp_path)
        )
        assert r.returncode == 0, r.stderr
        files = hub.files("me/pruned")
    assert files[out.name] == out.read_bytes() and "README.md" in files and "Pushed" in r.stdout


def alpha_sweep(tmp_path, capsys, *extra):
    return run_main(
        [
            "amplify-heads",
            tmp_path / "src.gguf",
            "--heads",
            "0.1,1.0",
            "--alpha",
            "2,0.5",
            "--out",
            tmp_path / "sweep",
            "--json",
            *extra,
        ],
        capsys,
    )


def test_alpha_sweep_bakes_one_exact_gguf_per_value(tmp_path, capsys):
    src = tmp_path / "src.gguf"
    write_typed_gguf(src, "Q4_K", head_dim=HEAD_DIM)  # whole 256-value super-blocks: powers of two are exact
    done = alpha_sweep(tmp_path, capsys)
    assert done.returncode == 0, done.stderr
    assert [v["label"] for v in json.loads(done.stdout)] == ["alpha-2", "alpha-0.5"]
    names = ["alpha-0.5.gguf", "alpha-2.gguf"]
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == sorted(
        n + s for n in names for s in ("", ".surgery.json", ".surgery.undo")
    )
    before = {la: tensor_values(src, f"blk.{la}.attn_output.weight") for la in (0, 1)}
    for alpha in (2.0, 0.5):
        out = tmp_path / "sweep" / f"alpha-{alpha:g}.gguf"
        assert verify_gguf(out, src).ok
        for layer, head in ((0, 1), (1, 0)):
            want = before[layer].copy()
            want[:, head * HEAD_DIM : (head + 1) * HEAD_DIM] *= np.float32(alpha)
            assert np.array_equal(tensor_values(out, f"blk.{layer}.attn_output.weight"), want)
        record = json.loads(sidecars(out)[0].read_text())
        assert {e["alpha"] for e in record["recipe"]["edits"]} == {alpha}

    first = {p.name: p.read_bytes() for p in (tmp_path / "sweep").iterdir() if not p.name.endswith(".json")}
    again = alpha_sweep(tmp_path, capsys, "--force")
    assert again.returncode == 0, again.stderr
    assert first == {n: (tmp_path / "sweep" / n).read_bytes() for n in first}  # reruns: the same bytes


def test_a_sweep_with_one_inexact_value_writes_nothing(tmp_path, capsys):
    src = tmp_path / "src.gguf"
    write_typed_gguf(src, "Q4_0", head_dim=HEAD_DIM)
    failed = run_main(["amplify-heads", src, "--heads", "0.1", "--alpha", "2,0.7", "--out", tmp_path / "sweep"], capsys)
    errors = [ln for ln in failed.stderr.splitlines() if ln.startswith("Error: ")]
    assert failed.returncode != 0 and len(errors) == 1
    assert errors[0].startswith("Error: alpha-0.7: blk.0.attn_output.weight (Q4_0)") and "--requantize" in errors[0]
    assert not (tmp_path / "sweep").exists() and not staging_leftovers(tmp_path)

    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "alpha-0.7.gguf").write_bytes(b"not surgery's")
    taken = run_main(
        [
            "amplify-heads",
            src,
            "--heads",
            "0.1",
            "--alpha",
            "2,0.7",
            "--requantize",
            "--force",
            "--out",
            tmp_path / "sweep",
        ],
        capsys,
    )
    assert taken.returncode != 0 and "was not written by surgery" in taken.stderr
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["alpha-0.7.gguf"]  # alpha-2 not baked either

    as_file = run_main(["amplify-heads", src, "--heads", "0.1", "--alpha", "2,4", "--out", tmp_path / "s.gguf"], capsys)
    assert as_file.returncode != 0 and "give a folder (e.g. --out" in as_file.stderr
    assert not (tmp_path / "s.gguf").exists()


def test_sweep_pushes_each_value_to_its_own_branch(tmp_path):
    src = tmp_path / "src.gguf"
    write_typed_gguf(src, "Q8_0", head_dim=HEAD_DIM)
    with FakeHub(TOKEN) as hub:
        r = run_surgery(
            [
                "amplify-heads",
                src,
                "--heads",
                "0.1",
                "--alpha",
                "2,4",
                "--out",
                tmp_path / "sweep",
                "--push-to",
                "me/sweep",
            ],
            hub_env(hub, tmp_path),
        )
        assert r.returncode == 0, r.stderr
        for label in ("alpha-2", "alpha-4"):
            files = hub.files("me/sweep", label)
            assert files[f"{label}.gguf"] == (tmp_path / "sweep" / f"{label}.gguf").read_bytes()
            assert "README.md" in files and f"{label}.gguf.surgery.undo" in files


def test_n_sweep_bakes_one_gguf_per_n_from_findings_on_the_file(tmp_path, capsys):
    """--n 2,3: the findings are computed once on the imported GGUF; n-2.gguf prunes the top two, n-3.gguf three."""
    from tests.support.tiny_gguf import gguf_source_model, write_tiny_gguf

    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, gguf_source_model())
    done = run_main(["prune-neurons", src, "--n", "2,3", "--out", tmp_path / "sweep", "--json"], capsys)
    assert done.returncode == 0, done.stderr
    assert [v["label"] for v in json.loads(done.stdout)] == ["n-2", "n-3"]
    pruned = {}
    for n in (2, 3):
        out = tmp_path / "sweep" / f"n-{n}.gguf"
        assert verify_gguf(out, src).ok
        record = json.loads(sidecars(out)[0].read_text())
        pruned[n] = [(e["layer"], e["neuron"]) for e in record["recipe"]["edits"]]
        assert len(pruned[n]) == n and record["neuron_selection"]["n"] == n
        assert "- **neuron_selection**" in checked_uploads(out)[1]["README.md"].decode()
    assert set(pruned[2]) < set(pruned[3])  # the same ranking, cut at two and at three
