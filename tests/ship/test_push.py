"""Hub push against a loopback fake Hub: repo creation, files, card metadata, branches, refusals."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from surgery.bake.bake import bake
from surgery.bake.card import card_hook
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import HeadScale, NeuronScale, Recipe
from surgery.core.errors import VerificationError
from surgery.ship.hub import check_pushable
from tests.support.fakehub import TOKEN, FakeHub, card_front_matter, hub_env, run_surgery
from tests.support.paths import REPO


@pytest.fixture
def baked(tiny, tmp_path) -> Path:
    src = tiny("llama")
    (src / "README.md").write_text("---\nlicense: mit\ntags: [demo]\n---\n# Tiny source\n")
    out = tmp_path / "baked"
    bake(Checkpoint(src), Recipe((HeadScale(0, 1, 2.0), NeuronScale(1, 3, 0.0))), out, card=card_hook())
    return out


def test_push_creates_repo_and_uploads_every_file(baked, tmp_path):
    with FakeHub(TOKEN) as hub:
        r = run_surgery(["push", baked, "--repo", "me/tiny-edit", "--private"], hub_env(hub, tmp_path))
        assert r.returncode == 0, r.stderr
        repo = hub.repos["me/tiny-edit"]
        assert repo.private
        files = hub.files("me/tiny-edit")
        local = {p.relative_to(baked).as_posix(): p.read_bytes() for p in baked.rglob("*") if p.is_file()}
        assert files == local
        meta = card_front_matter(files["README.md"].decode())
        assert "surgery" in meta["tags"] and meta["library_name"] == "transformers" and meta["license"] == "mit"
        assert "POST /api/validate-yaml" in hub.requests
        assert any(q.endswith(".git/info/lfs/objects/batch") for q in hub.requests)  # weights went by LFS
    assert TOKEN not in r.stdout + r.stderr
    assert "Pushed" in r.stdout and "structural check against the source" in r.stdout


def test_push_to_branch_and_pull_request(baked, tmp_path):
    with FakeHub(TOKEN) as hub:
        env = hub_env(hub, tmp_path)
        assert run_surgery(["push", baked, "--repo", "me/x", "--revision", "alpha-2"], env).returncode == 0
        assert "model.safetensors" in hub.files("me/x", "alpha-2") and not hub.files("me/x", "main")
        r = run_surgery(["push", baked, "--repo", "me/x", "--create-pr"], env)
        assert r.returncode == 0, r.stderr
        assert len(hub.repos["me/x"].pulls) == 1 and "discussions/1" in r.stdout
        # nothing reached main: the line says a pull request was opened, not "Pushed … (main)"
        assert "Opened a pull request" in r.stdout and "Pushed" not in r.stdout, r.stdout


def test_corrupted_folder_is_refused_before_any_request(baked, tmp_path):
    weights = baked / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x10
    weights.write_bytes(bytes(data))
    with pytest.raises(VerificationError, match="refusing to push"):
        check_pushable(baked)
    with FakeHub(TOKEN) as hub:
        r = run_surgery(["push", baked, "--repo", "me/bad"], hub_env(hub, tmp_path))
        assert r.returncode == 2 and "refusing to push" in r.stderr
        assert hub.requests == [] and not hub.repos


def test_without_the_source_every_hash_and_the_seal_are_checked(baked, tmp_path):
    from surgery.bake.provenance import load_provenance
    from surgery.bake.source_index import local_source_path

    source = local_source_path(load_provenance(baked).source)  # surgery.json names it by its folder's name
    source.rename(tmp_path / "moved-away")  # the recorded source is no longer on this machine
    assert "sha256 of every recorded file" in check_pushable(baked)[0]
    (baked / "extra.txt").write_text("not from the bake")
    with pytest.raises(VerificationError, match="extra.txt is not recorded"):
        check_pushable(baked)
    (baked / "extra.txt").unlink()
    prov = (baked / "surgery.json").read_text()
    (baked / "surgery.json").write_text(prov.replace('"tool_version"', '"tool_version" '))
    with pytest.raises(VerificationError, match="seal"):
        check_pushable(baked)


def test_bad_or_missing_token(baked, tmp_path):
    with FakeHub(TOKEN) as hub:
        wrong = "hf_wrongTokenThatMustNeverBePrinted99"
        r = run_surgery(["push", baked, "--repo", "me/y"], hub_env(hub, tmp_path, token=wrong))
        assert r.returncode == 2 and "refused the token" in r.stderr and wrong not in r.stdout + r.stderr
        r = run_surgery(["push", baked, "--repo", "me/y"], hub_env(hub, tmp_path, token=None))
        assert r.returncode == 2 and "no Hugging Face token" in r.stderr
        assert not hub.repos


def test_a_name_the_hub_refuses_is_told_before_any_request(baked, tmp_path):
    """'me/..' matches NAMESPACE/NAME but breaks the Hub's rules: one line saying so, not "cannot reach the Hub"."""
    with FakeHub(TOKEN) as hub:
        r = run_surgery(["push", baked, "--repo", "me/a--b"], hub_env(hub, tmp_path))
        assert r.returncode == 2 and "'me/a--b' is not a Hub repo id: " in r.stderr, r.stderr
        assert "cannot reach" not in r.stderr and not hub.requests


def test_a_missing_folder_is_told_before_the_token(tmp_path):
    """A typo'd path is named as missing, even without a token (not "no token", then "not a folder")."""
    with FakeHub(TOKEN) as hub:
        r = run_surgery(["push", tmp_path / "nope", "--repo", "me/y"], hub_env(hub, tmp_path, token=None))
        assert r.returncode == 2 and "nope does not exist; give a baked checkpoint" in r.stderr, r.stderr
        assert not hub.repos


def test_sweep_pushes_each_value_to_its_own_branch(tiny, tmp_path):
    src = tiny("llama")
    script = textwrap.dedent(f"""
        from pathlib import Path
        from surgery.api.bake_options import BakeOptions
        from surgery.api.baking import Planned, bake_sweep, sweep_label
        from surgery.core.edits import HeadScale, Recipe
        plans = [Planned(sweep_label("alpha", a), Recipe((HeadScale(0, 1, a),)), {{"selection": {{"alpha": a}}}})
                 for a in (1.5, 2.0)]
        bake_sweep({str(src)!r}, plans, Path({str(tmp_path / "sweep")!r}), bake=BakeOptions(push_to="me/sweep", verify=False))
    """)
    with FakeHub(TOKEN) as hub:
        r = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            env=hub_env(hub, tmp_path),
            cwd=REPO,
            timeout=180,
        )
        assert r.returncode == 0, r.stderr
        for label in ("alpha-1.5", "alpha-2"):
            files = hub.files("me/sweep", label)
            assert files["surgery.json"] == (tmp_path / "sweep" / label / "surgery.json").read_bytes()
            assert "alpha: 2" in files["README.md"].decode() if label == "alpha-2" else True
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["alpha-1.5", "alpha-2"]


def test_a_sweep_folder_is_named_as_such(baked, tmp_path):
    """A sweep's folder was made by surgery: push says which value folders it holds, not "not made by surgery"."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    baked.rename(sweep / "alpha-2")
    with pytest.raises(
        VerificationError,
        match=r"is a sweep made by surgery, one baked folder per value \(alpha-2\); "
        r"give one of them, .*or bake with --push-to",
    ):
        check_pushable(sweep)
    with FakeHub(TOKEN) as hub:  # before the token: it was "no Hugging Face token found" first
        r = run_surgery(["push", sweep, "--repo", "me/y"], hub_env(hub, tmp_path, token=None))
        assert r.returncode == 2 and "is a sweep made by surgery" in r.stderr, r.stderr


def test_push_exported_adapter(tiny, tmp_path):
    from surgery.bake.lora import export_lora

    adapter = tmp_path / "adapter"
    export_lora(Checkpoint(tiny("llama")), Recipe((HeadScale(0, 1, 2.0),)), adapter)
    assert check_pushable(adapter)[0] == "adapter config and weights header"
    with FakeHub(TOKEN) as hub:
        r = run_surgery(["push", adapter, "--repo", "me/lora"], hub_env(hub, tmp_path))
        assert r.returncode == 0, r.stderr
        files = hub.files("me/lora")
        assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= set(files)
        meta = card_front_matter(files["README.md"].decode())
        assert meta["library_name"] == "peft" and "lora" in meta["tags"]


def test_apply_with_push_to(tiny, tmp_path):
    src = tiny("llama")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(Recipe((HeadScale(0, 1, 2.0),)).to_yaml())
    with FakeHub(TOKEN) as hub:
        r = run_surgery(
            [
                "apply",
                recipe,
                "--model",
                src,
                "--out",
                tmp_path / "out",
                "--no-verify",
                "--push-to",
                "me/applied",
                "--private",
            ],
            hub_env(hub, tmp_path),
        )
        assert r.returncode == 0, r.stderr
        assert hub.repos["me/applied"].private
        assert hub.files("me/applied")["surgery.json"] == (tmp_path / "out" / "surgery.json").read_bytes()
    assert "Pushed" in r.stdout and TOKEN not in r.stdout + r.stderr
