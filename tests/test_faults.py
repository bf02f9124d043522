"""Faults: a bake or undo killed at any point, a full disk, Ctrl-C in a findings write.

Whatever happens, the destination is either absent or complete and verifiable, the source is
unchanged, leftovers are cleaned (and reported) by the next run, and a rerun succeeds.
"""

from __future__ import annotations

import json
import resource
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from surgery.checkpoint import Checkpoint
from surgery.verify import verify

from .conftest import build_tiny
from .helpers_cli import REPO, cli_env, error_line, faulty_cli, run_cli, staging_leftovers, tree_hashes

HEADS = ["--heads", "0.1,2.3", "--alpha", "2.5"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A sharded tiny llama: a kill lands between files as well as inside one."""
    return build_tiny("llama", tmp_path_factory.mktemp("base") / "llama", shard="20KB")


@pytest.fixture
def src(base, tmp_path) -> Path:
    path = tmp_path / "src"
    shutil.copytree(base, path)
    return path


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=cli_env(), timeout=120, **kw)


def _verified(src: Path, out: Path) -> bool:
    return verify(Checkpoint(src), out, run_model=False).ok


def _recipe_of(out: Path) -> list:
    return json.loads((out / "surgery.json").read_text())["recipe"]["edits"]


@pytest.mark.parametrize("point", ["kill@copy", "kill@pwrite", "kill@hash", "kill@publish"])
def test_bake_killed(point, src, tmp_path):
    before = tree_hashes(src)
    out = tmp_path / "outs" / "baked"
    out.parent.mkdir()
    args = ["amplify-heads", src, *HEADS, "--out", out, "--no-verify"]

    killed = _run(faulty_cli(point, args))
    assert killed.returncode == -signal.SIGKILL and f"fault: {point}" in killed.stderr, killed.stderr
    assert tree_hashes(src) == before
    assert not out.exists(), "a killed bake published a folder"
    assert any(".surgery-tmp-" in n for n in staging_leftovers(out.parent)), "nothing to clean: fault too early?"

    rerun = run_cli(args)
    assert rerun.returncode == 0, rerun.stderr
    assert "left behind by an interrupted run" in rerun.stderr
    assert staging_leftovers(out.parent) == []
    assert _verified(src, out)
    assert tree_hashes(src) == before


def test_force_bake_killed_between_renames_loses_nothing(src, tmp_path):
    """--force moves the old output aside before renaming the new one in: a kill there must not
    lose the old output; the next run puts it back."""
    out = tmp_path / "outs" / "baked"
    out.parent.mkdir()
    first = run_cli(["amplify-heads", src, "--heads", "1.1", "--alpha", "3", "--out", out, "--no-verify"])
    assert first.returncode == 0, first.stderr
    old = tree_hashes(out)
    args = ["amplify-heads", src, *HEADS, "--out", out, "--no-verify"]

    killed = _run(faulty_cli("kill@swap", [*args, "--force"]))
    assert killed.returncode == -signal.SIGKILL and "fault: kill@swap" in killed.stderr, killed.stderr
    assert not out.exists()

    # A rerun without --force gives the old output back and refuses to replace it.
    refused = run_cli(args)
    assert "already exists" in error_line(refused)
    assert tree_hashes(out) == old and _verified(src, out)
    assert "restored" in refused.stderr
    assert staging_leftovers(out.parent) == []

    replaced = run_cli([*args, "--force"])
    assert replaced.returncode == 0, replaced.stderr
    assert _verified(src, out) and _recipe_of(out)[0]["layer"] == 0
    assert staging_leftovers(out.parent) == []


def test_ctrl_c_during_patch_cleans_up(src, tmp_path):
    out = tmp_path / "outs" / "baked"
    out.parent.mkdir()
    result = _run(faulty_cli("int@pwrite", ["amplify-heads", src, *HEADS, "--out", out, "--no-verify"]))
    assert "fault: int@pwrite" in result.stderr
    assert result.returncode == 130
    assert "interrupted" in error_line(result)
    assert not out.exists() and staging_leftovers(out.parent) == []


def test_undo_killed(src, tmp_path):
    baked, restored = tmp_path / "baked", tmp_path / "restored"
    assert run_cli(["amplify-heads", src, *HEADS, "--out", baked, "--no-verify"]).returncode == 0
    baked_hashes = tree_hashes(baked)

    killed = _run(faulty_cli("kill@pwrite", ["undo", baked, "--out", restored]))
    assert killed.returncode == -signal.SIGKILL and "fault: kill@pwrite" in killed.stderr, killed.stderr
    assert not restored.exists() and tree_hashes(baked) == baked_hashes

    rerun = run_cli(["undo", baked, "--out", restored])
    assert rerun.returncode == 0, rerun.stderr
    assert "left behind by an interrupted run" in rerun.stderr
    assert tree_hashes(restored) == tree_hashes(src)
    assert staging_leftovers(tmp_path) == []


# --- a full disk ---------------------------------------------------------------------------

def _limit_file_size(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.parametrize("what", ["copy", "undo-file"])
def test_file_size_limit(what, src, tmp_path):
    """RLIMIT_FSIZE makes writes past the limit fail (EFBIG), as a full disk fails them (ENOSPC)."""
    out = tmp_path / "outs" / "baked"
    out.parent.mkdir()
    shard = max((p.stat().st_size for p in src.glob("*.safetensors")))
    if what == "copy":
        args, limit = ["amplify-heads", src, *HEADS], shard // 2
    else:  # every shard fits; the undo file (every MLP neuron's original weights) does not
        every = ",".join(f"{layer}:{i}" for layer in range(3) for i in range(48))
        args, limit = ["prune-neurons", src, "--neurons", every], shard + 4096
    before = tree_hashes(src)
    result = run_cli([*args, "--out", out, "--no-verify"], preexec_fn=_limit_file_size(limit))
    line = error_line(result)
    assert "File too large" in line and "choose another --out" in line, line
    assert not out.exists() and staging_leftovers(out.parent) == []
    assert tree_hashes(src) == before


def test_full_disk(src, tmp_path):
    """A real ENOSPC: a 64 KiB tmpfs in a private mount namespace (root only)."""
    if not shutil.which("unshare") or _run(["unshare", "-m", "--propagation", "private", "true"]).returncode:
        pytest.skip("needs mount namespaces (root): the file-size-limit test covers the same path")
    disk = tmp_path / "disk"
    disk.mkdir()
    cli = [sys.executable, "-m", "surgery", "amplify-heads", str(src), *HEADS, "--out", str(disk / "baked"),
           "--no-verify"]
    script = (f"mount -t tmpfs -o size=64k tmpfs {shlex.quote(str(disk))} || exit 99; "
              f"{shlex.join(cli)}; rc=$?; echo \"left: $(ls -A {shlex.quote(str(disk))})\"; exit $rc")
    before = tree_hashes(src)
    result = _run(["unshare", "-m", "--propagation", "private", "sh", "-c", script])
    if result.returncode == 99:
        pytest.skip("cannot mount a tmpfs here")
    assert result.stdout.strip().endswith("left:"), f"leftovers on the full disk: {result.stdout}"
    result.stdout = ""
    line = error_line(result)
    assert "no space left" in line and "free space or choose another --out" in line, line
    assert tree_hashes(src) == before
