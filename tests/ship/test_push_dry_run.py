"""push --dry-run: every check a push makes, then the files it would upload (names and sizes), the repo
and its visibility, with no request to the Hub (a loopback fake Hub counts them); the push that follows
uploads exactly those files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from surgery.bake.bake import bake
from surgery.bake.card import card_hook
from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import HeadScale, Recipe
from tests.support.fakehub import TOKEN, FakeHub, hub_env, run_surgery


@pytest.fixture
def baked(tiny, tmp_path) -> Path:
    out = tmp_path / "baked"
    bake(Checkpoint(tiny("llama")), Recipe((HeadScale(0, 1, 2.0),)), out, card=card_hook())
    return out


def _dry_run(hub: FakeHub, tmp_path: Path, path: Path, *extra: str) -> dict:
    r = run_surgery(["push", path, "--repo", "me/planned", "--dry-run", "--json", *extra], hub_env(hub, tmp_path))
    assert r.returncode == 0, r.stderr
    assert hub.requests == [] and not hub.repos  # not one request
    return json.loads(r.stdout)


def _pushed_sizes(hub: FakeHub, tmp_path: Path, path: Path) -> dict[str, int]:
    r = run_surgery(["push", path, "--repo", "me/planned", "--private"], hub_env(hub, tmp_path))
    assert r.returncode == 0, r.stderr
    return {name: len(data) for name, data in hub.files("me/planned").items()}


def test_a_dry_run_lists_what_the_push_uploads_and_sends_nothing(baked, tmp_path):
    with FakeHub(TOKEN) as hub:
        plan = _dry_run(hub, tmp_path, baked, "--private")
        assert plan["repo"] == "me/planned" and plan["private"] is True and plan["revision"] == "main"
        assert plan["checked"].startswith("structural check against the source")
        assert plan["card"] == "README.md in the folder" and plan["message"] == "Upload baked with surgery"
        planned = {f["name"]: f["size"] for f in plan["files"]}
        assert planned == _pushed_sizes(hub, tmp_path, baked)
    with FakeHub(TOKEN) as hub:  # as people read it
        r = run_surgery(["push", baked, "--repo", "me/planned", "--dry-run"], hub_env(hub, tmp_path))
        assert r.returncode == 0 and hub.requests == [], r.stderr
    text = " ".join(r.stdout.split())
    assert "Would upload (dry run, nothing sent)" in text and "model.safetensors" in text, text
    assert f"Would push {len(planned)} files (" in text and "to me/planned, branch main" in text, text
    assert "a new repo would be public" in text, text


def test_a_dry_run_of_a_gguf_bake_lists_its_card_from_the_record(tmp_path):
    from surgery.bake.gguf import bake_gguf
    from surgery.gguf.model import open_gguf
    from tests.support.typed_gguf import write_typed_gguf

    src, out = tmp_path / "src.gguf", tmp_path / "edited.gguf"
    write_typed_gguf(src, "Q8_0")
    bake_gguf(open_gguf(src), Recipe((HeadScale(1, 0, 2.0),)), out)
    with FakeHub(TOKEN) as hub:
        plan = _dry_run(hub, tmp_path, out)
        assert plan["card"] == "README.md from the record"
        assert {f["name"]: f["size"] for f in plan["files"]} == _pushed_sizes(hub, tmp_path, out)


@pytest.mark.parametrize("problem", ["repo id", "corrupted", "card", "token"])
def test_a_dry_run_refuses_what_the_push_refuses(tiny, baked, tmp_path, problem):
    repo, token = "me/planned", TOKEN
    if problem == "repo id":
        repo = "me/a--b"
    elif problem == "corrupted":
        weights = baked / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0x10
        weights.write_bytes(bytes(data))
    elif problem == "card":  # an adapter's card is not sealed (a baked folder's is: verification says it)
        from surgery.bake.lora import export_lora

        baked = tmp_path / "adapter"
        export_lora(Checkpoint(tiny("llama")), Recipe((HeadScale(0, 1, 2.0),)), baked)
        card = baked / "README.md"
        card.write_text(card.read_text().replace("---\n", "---\nlicense: [mit\n", 1))
    else:
        token = None
    said = {
        "repo id": "'me/a--b' is not a Hub repo id",
        "corrupted": "refusing to push",
        "card": "the model card's metadata does not parse",
        "token": "no Hugging Face token found",
    }[problem]
    with FakeHub(TOKEN) as hub:
        r = run_surgery(["push", baked, "--repo", repo, "--dry-run"], hub_env(hub, tmp_path, token=token))
        assert r.returncode == 2 and said in r.stderr and hub.requests == [], r.stderr
