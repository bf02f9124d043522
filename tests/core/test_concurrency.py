"""Concurrency: two bakes into one destination, many writers and readers of one findings cache entry."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from surgery.bake.verify import verify
from surgery.core.checkpoint import Checkpoint
from tests.support.cli import REPO, cli_env, faulty_cli, staging_leftovers, tree_hashes
from tests.support.tiny import build_tiny


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return build_tiny("llama", tmp_path_factory.mktemp("base") / "llama", shard="20KB")


def _start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=cli_env())


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_two_bakes_into_one_destination(force, base, tmp_path):
    """Two bakes into one destination at once: the lock lets exactly one write; the other fails at
    once with one clear line. The first to take the lock waits (tests/support/fault_runner.py hold:) until
    the other has failed, so the two certainly overlap however slowly each starts."""
    src = tmp_path / "src"
    shutil.copytree(base, src)
    before = tree_hashes(src)
    out = tmp_path / "outs" / "baked"
    out.parent.mkdir()
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    runs = [
        _start(
            faulty_cli(
                f"hold:{barrier}",
                [
                    "amplify-heads",
                    src,
                    "--heads",
                    spec,
                    "--alpha",
                    "2",
                    "--out",
                    out,
                    "--no-verify",
                    *(["--force"] if force else []),
                ],
            )
        )
        for spec in ("0.1", "1.2")
    ]
    deadline = time.monotonic() + 240
    while sum(p.poll() is None for p in runs) == 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (barrier / "holding").exists(), "neither run reached the copy"
    (barrier / "go").touch()
    results = [(p.wait(timeout=120), *p.communicate()) for p in runs]

    codes = [rc for rc, _, _ in results]
    assert sorted(codes) == [0, 2], results
    loser = next(err for rc, _, err in results if rc != 0)
    errors = [ln for ln in loser.splitlines() if ln.startswith("Error: ")]
    assert errors == [loser.strip().splitlines()[-1]] and "Traceback" not in loser, loser
    assert "another surgery process is writing" in errors[0], errors[0]
    assert verify(Checkpoint(src), out, run_model=False).ok
    winner = codes.index(0)
    edited = json.loads((out / "surgery.json").read_text())["recipe"]["edits"][0]
    assert (edited["layer"], edited["head"]) == ((0, 1), (1, 2))[winner]
    assert staging_leftovers(out.parent) == []
    assert tree_hashes(src) == before


WRITER = """
import sys
from pathlib import Path
from surgery.find.findings import Findings, save_findings
path, tag, rounds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for i in range(rounds):
    save_findings(Findings.from_dict({"format": "surgery-findings", "version": 1, "kind": "heads", "writer": tag,
                                      "round": i, "model": {"fingerprint": "f" * 64},
                                      "scores": [[tag, i, k] for k in range(5000)]}), path)
"""

READER = """
import json, sys
from pathlib import Path
from surgery.core.errors import FindingsError
from surgery.find.findings import load_findings
from tests.support.paths import REPO
path, stop = Path(sys.argv[1]), Path(sys.argv[2])
reads, errors = 0, []
while not stop.exists():
    try:
        data = load_findings(path, "heads").extra
    except FindingsError as exc:
        errors.append(str(exc))
        continue
    if len(data["scores"]) != 5000 or any(row[0] != data["writer"] for row in data["scores"]):
        errors.append("mixed or short content")
    reads += 1
print(json.dumps({"reads": reads, "errors": errors[:3], "n_errors": len(errors)}))
"""


def test_findings_cache_writers_and_readers(tmp_path):
    """Four processes rewrite one cache entry while two read it: every read is a whole document
    written by a single writer, and the entry ends as one writer's last round."""
    from surgery.find.findings import Findings, load_findings, save_findings

    path = tmp_path / "cache" / "heads" / "entry.json"
    save_findings(
        Findings.from_dict(
            {
                "format": "surgery-findings",
                "version": 1,
                "kind": "heads",
                "writer": "seed",
                "round": 0,
                "model": {"fingerprint": "f" * 64},
                "scores": [["seed", 0, k] for k in range(5000)],
            }
        ),
        path,
    )
    stop = tmp_path / "stop"
    readers = [_start([sys.executable, "-c", READER, str(path), str(stop)]) for _ in range(2)]
    writers = [_start([sys.executable, "-c", WRITER, str(path), f"w{i}", "25"]) for i in range(4)]
    for w in writers:
        assert w.wait(timeout=120) == 0, w.communicate()[1]
    time.sleep(0.2)
    stop.touch()
    for r in readers:
        assert r.wait(timeout=60) == 0, r.communicate()[1]
        report = json.loads(r.communicate()[0])
        assert report["n_errors"] == 0, report
        assert report["reads"] > 0
    final = load_findings(path, "heads").extra
    assert final["writer"] in {"w0", "w1", "w2", "w3"} and final["round"] == 24
    assert [p.name for p in path.parent.iterdir()] == [path.name], "temporary files left behind"


@pytest.mark.slow(minutes=1)  # three real find-heads runs: about 20 s idle, 2 min on a busy machine
def test_two_find_heads_share_the_cache(tiny, tmp_path):
    """Two real find-heads runs on one model at once, then a third: the runs agree, the cache entry
    is whole, the third run reads it, and a damaged entry is recomputed, not trusted."""
    from surgery.find.findings import load_findings
    from tests.support.binding import char_model, write_small_benchmark

    model = char_model(tiny, "llama")
    bench = write_small_benchmark(tmp_path / "bench.jsonl")
    cache = tmp_path / "shared-cache"
    env = cli_env(SURGERY_CACHE=str(cache))

    def find(out: Path) -> subprocess.Popen:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "surgery",
                "find-heads",
                str(model),
                "--benchmark",
                str(bench),
                "--max-pairs",
                "4",
                "--random-sets",
                "1",
                "--out",
                str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )

    runs = [find(tmp_path / f"f{i}.json") for i in range(2)]
    for run in runs:
        assert run.wait(timeout=300) == 0, run.communicate()[1]
    first, second = (load_findings(tmp_path / f"f{i}.json", "heads").to_dict() for i in range(2))
    assert first["selected_heads"] == second["selected_heads"]
    entries = list(cache.rglob("*.json"))
    assert len(entries) == 1 and [p.name for p in entries[0].parent.iterdir()] == [entries[0].name]
    assert load_findings(entries[0], "heads").to_dict()["selected_heads"] == first["selected_heads"]

    entries[0].write_text(entries[0].read_text()[:100])  # a damaged entry (e.g. an old crash)
    third = find(tmp_path / "f2.json")
    assert third.wait(timeout=300) == 0, third.communicate()[1]
    assert load_findings(entries[0], "heads").to_dict()["selected_heads"] == first["selected_heads"]
