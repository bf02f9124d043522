"""Faults: a bake or undo killed at any point, a full disk, Ctrl-C in a findings write.

Whatever happens, the destination is either absent or complete and verifiable, the source is
unchanged, leftovers are cleaned (and reported) by the next run, and a rerun succeeds.
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from surgery.bake.verify import verify
from surgery.core.checkpoint import Checkpoint
from tests.support.cli import REPO, cli_env, error_line, faulty_cli, run_cli, run_main, staging_leftovers, tree_hashes
from tests.support.tiny import build_tiny

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
def test_bake_killed(point, src, tmp_path, capsys):
    before = tree_hashes(src)
    out = tmp_path / "outs" / "baked"
    out.parent.mkdir()
    args = ["amplify-heads", src, *HEADS, "--out", out, "--no-verify"]

    killed = _run(faulty_cli(point, args))
    assert killed.returncode == -signal.SIGKILL and f"fault: {point}" in killed.stderr, killed.stderr
    assert tree_hashes(src) == before
    assert not out.exists(), "a killed bake published a folder"
    assert any(".surgery-tmp-" in n for n in staging_leftovers(out.parent)), "nothing to clean: fault too early?"

    rerun = run_main(args, capsys)  # the rerun is an ordinary run: in-process is the same code
    assert rerun.returncode == 0, rerun.stderr
    assert "left behind by an interrupted run" in rerun.stderr
    assert staging_leftovers(out.parent) == []
    assert _verified(src, out)
    assert tree_hashes(src) == before


def test_force_bake_killed_between_renames_loses_nothing(src, tmp_path, capsys):
    """--force moves the old output aside before renaming the new one in: a kill there must not
    lose the old output; the next run puts it back."""
    out = tmp_path / "outs" / "baked"
    out.parent.mkdir()
    first = run_main(["amplify-heads", src, "--heads", "1.1", "--alpha", "3", "--out", out, "--no-verify"], capsys)
    assert first.returncode == 0, first.stderr
    old = tree_hashes(out)
    args = ["amplify-heads", src, *HEADS, "--out", out, "--no-verify"]

    killed = _run(faulty_cli("kill@swap", [*args, "--force"]))
    assert killed.returncode == -signal.SIGKILL and "fault: kill@swap" in killed.stderr, killed.stderr
    assert not out.exists()

    # A rerun without --force gives the old output back and refuses to replace it.
    refused = run_main(args, capsys)
    assert "already exists" in error_line(refused)
    assert tree_hashes(out) == old and _verified(src, out)
    assert "restored" in refused.stderr
    assert staging_leftovers(out.parent) == []

    replaced = run_main([*args, "--force"], capsys)
    assert replaced.returncode == 0, replaced.stderr
    assert _verified(src, out) and _recipe_of(out)[0]["layer"] == 0
    assert staging_leftovers(out.parent) == []


@pytest.mark.parametrize("fault", ["int@pwrite", "term@pwrite"], ids=["ctrl-c", "sigterm"])
def test_interrupt_during_patch_cleans_up(fault, src, tmp_path):
    out = tmp_path / "outs" / "baked"
    out.parent.mkdir()
    result = _run(faulty_cli(fault, ["amplify-heads", src, *HEADS, "--out", out, "--no-verify"]))
    assert f"fault: {fault}" in result.stderr
    assert result.returncode == 130
    assert "interrupted" in error_line(result)
    assert not out.exists() and staging_leftovers(out.parent) == []


def test_undo_killed(src, tmp_path, capsys):
    baked, restored = tmp_path / "baked", tmp_path / "restored"
    assert run_main(["amplify-heads", src, *HEADS, "--out", baked, "--no-verify"], capsys).returncode == 0
    baked_hashes = tree_hashes(baked)

    killed = _run(faulty_cli("kill@pwrite", ["undo", baked, "--out", restored]))
    assert killed.returncode == -signal.SIGKILL and "fault: kill@pwrite" in killed.stderr, killed.stderr
    assert not restored.exists() and tree_hashes(baked) == baked_hashes

    rerun = run_main(["undo", baked, "--out", restored], capsys)
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
    shard = max(p.stat().st_size for p in src.glob("*.safetensors"))
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
    cli = [
        sys.executable,
        "-m",
        "surgery",
        "amplify-heads",
        str(src),
        *HEADS,
        "--out",
        str(disk / "baked"),
        "--no-verify",
    ]
    script = (
        f"mount -t tmpfs -o size=64k tmpfs {shlex.quote(str(disk))} || exit 99; "
        f'{shlex.join(cli)}; rc=$?; echo "left: $(ls -A {shlex.quote(str(disk))})"; exit $rc'
    )
    before = tree_hashes(src)
    result = _run(["unshare", "-m", "--propagation", "private", "sh", "-c", script])
    if result.returncode == 99:
        pytest.skip("cannot mount a tmpfs here")
    assert result.stdout.strip().endswith("left:"), f"leftovers on the full disk: {result.stdout}"
    result.stdout = ""
    line = error_line(result)
    assert "no space left" in line and "free space or choose another --out" in line, line
    assert tree_hashes(src) == before


# --- an interrupted find: the findings cache is never left corrupt ---------------------------


def _findings(tag: str, size: int = 1000):
    """A findings document big enough that writing it takes many system calls."""
    from surgery.find.findings import Findings

    return Findings.from_dict(
        {
            "format": "surgery-findings",
            "version": 1,
            "kind": "heads",
            "tag": tag,
            "model": {"fingerprint": "f" * 64},
            "scores": [[i * 0.5, tag] for i in range(size)],
        }
    )


def test_ctrl_c_inside_findings_write_keeps_the_old_entry(tmp_path, monkeypatch):
    from surgery.core.cache import cache_path
    from surgery.find import findings

    path = cache_path("heads", "f" * 64, "d" * 64, {"n": 1})
    findings.save_findings(_findings("old"), path)

    def interrupted(fd):
        raise KeyboardInterrupt  # what Ctrl-C raises in the main thread, here mid-write

    monkeypatch.setattr(os, "fsync", interrupted)  # the os module atomic_write_text calls
    with pytest.raises(KeyboardInterrupt):
        findings.save_findings(_findings("new"), path)
    assert findings.load_findings(path, "heads").extra["tag"] == "old"
    assert [p.name for p in path.parent.iterdir()] == [path.name], "a temporary file was left"

    fresh = path.with_name("other.json")
    with pytest.raises(KeyboardInterrupt):
        findings.save_findings(_findings("new"), fresh)
    assert not fresh.exists() and [p.name for p in path.parent.iterdir()] == [path.name]


WRITER = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal has it (see fault_runner.py)
from pathlib import Path
from surgery.find.findings import Findings, save_findings
from tests.support.paths import REPO
path, tag = Path(sys.argv[1]), sys.argv[2]
doc = Findings.from_dict({"format": "surgery-findings", "version": 1, "kind": "heads", "model": {"fingerprint": "f" * 64},
                          "scores": [[i * 0.5, tag] for i in range(20000)]})
i = 0
while True:
    doc.extra["tag"] = f"{tag}-{i}"
    save_findings(doc, path)
    if i == 0:
        print("ready", flush=True)
    i += 1
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill"])
def test_find_interrupted_while_writing_cache(sig, tmp_path):
    """A real process rewriting a cache entry in a loop, interrupted at several random moments:
    the entry is always complete JSON; Ctrl-C leaves no temporary file, and a SIGKILL's
    temporary file is removed by the next writer."""
    from surgery.find import findings

    path = tmp_path / "cache" / "heads" / "entry.json"
    rng = random.Random(7)
    for round_ in range(4):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), f"r{round_}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=REPO,
        )
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(sig)
        proc.wait(timeout=30)
        data = findings.load_findings(path, "heads").extra
        assert data["tag"].startswith(f"r{round_}-") and len(data["scores"]) == 20000
        if sig == signal.SIGINT:
            assert [p.name for p in path.parent.iterdir()] == [path.name]
    findings.save_findings(_findings("final"), path)
    assert [p.name for p in path.parent.iterdir()] == [path.name], "stale temporaries were not removed"


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path):
    from surgery.find import findings

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = tmp_path / "entry.json"
    stale = tmp_path / f".entry.json.{int(dead.stdout)}.0a0b0c0d.tmp"
    live = tmp_path / f".entry.json.{os.getpid()}.0a0b0c0d.tmp"  # a writer still at work: kept
    stale.write_text('{"half')
    live.write_text('{"half')
    findings.save_findings(_findings("new"), path)
    assert not stale.exists() and live.exists()
    assert findings.load_findings(path, "heads").extra["tag"] == "new"


# --- temporaries of other destinations in the same folder ----------------------------------


def test_a_killed_bakes_temporary_is_removed_by_a_bake_into_another_out(src, tmp_path, capsys):
    """Issue 33.11: a SIGKILLed bake leaves its hidden temporary folder; the next bake into *another*
    --out of the same folder removes it (its writer is dead) and says so, with its size."""
    parent = tmp_path / "outs"
    parent.mkdir()
    killed = _run(faulty_cli("kill@copy", ["amplify-heads", src, *HEADS, "--out", parent / "first", "--no-verify"]))
    assert killed.returncode == -signal.SIGKILL and "fault: kill@copy" in killed.stderr, killed.stderr
    stale = [n for n in staging_leftovers(parent) if ".surgery-tmp-" in n]
    assert stale and stale[0].startswith(".first.surgery-tmp-")
    assert stale[0].split(".surgery-tmp-")[1].split("@")[0].isdigit(), "the temporary names no owner process"

    other = run_main(["amplify-heads", src, *HEADS, "--out", parent / "second", "--no-verify"], capsys)
    assert other.returncode == 0, other.stderr
    said = [ln for ln in other.stderr.splitlines() if stale[0] in ln]
    assert len(said) == 1 and "left behind by an interrupted run" in said[0], other.stderr
    assert re.search(r"\(\d[\d.]* (B|KiB|MiB)\)", said[0]), said[0]
    assert staging_leftovers(parent) == [] and not (parent / "first").exists()
    assert _verified(src, parent / "second")


def test_a_live_writers_temporary_is_kept(src, tmp_path, capsys):
    """The variant: a bake still at work in the same folder (it holds its lock), and a temporary
    named after a process of another host, are left alone; the live one then finishes."""
    parent = tmp_path / "outs"
    parent.mkdir()
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    live = subprocess.Popen(
        faulty_cli(f"hold:{barrier}", ["amplify-heads", src, *HEADS, "--out", parent / "live", "--no-verify"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=cli_env(),
    )
    try:
        deadline = time.monotonic() + 240
        while not (barrier / "holding").exists() and live.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (barrier / "holding").exists(), live.communicate()
        working = [n for n in staging_leftovers(parent) if ".surgery-tmp-" in n]
        assert len(working) == 1 and working[0].startswith(f".live.surgery-tmp-{live.pid}@"), working
        elsewhere = parent / ".remote.surgery-tmp-1@another-host"  # pid 1 of another machine: unknown
        elsewhere.mkdir()

        other = run_main(["amplify-heads", src, *HEADS, "--out", parent / "second", "--no-verify"], capsys)
        assert other.returncode == 0, other.stderr
        assert "left behind" not in other.stderr, other.stderr
        assert (parent / working[0]).is_dir() and elsewhere.is_dir()
    finally:
        (barrier / "go").touch()
        rc, err = live.wait(timeout=120), live.communicate()[1]
    assert rc == 0, err
    assert _verified(src, parent / "live") and _verified(src, parent / "second")
    assert staging_leftovers(parent) == [elsewhere.name]
