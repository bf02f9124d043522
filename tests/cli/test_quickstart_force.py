"""examples/quickstart.sh --force (issue 33.7): it reruns into its folder, never deleting a file it did
not write; each surgery step replaces its own output folder through surgery's own --force check."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.cli import tree_hashes
from tests.support.paths import REPO

OWN = {"pruned/surgery.json": "{}", "eval/pruned.json": "{}", "findings/neurons.json": "{}", "timings.tsv": "t"}


def _quickstart(out: Path) -> subprocess.CompletedProcess:
    """The script up to its first need of surgery: no surgery on PATH, so it stops there."""
    return subprocess.run(
        ["bash", str(REPO / "examples" / "quickstart.sh"), "--no-install", "--force", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(out.parent)},
    )


def _fill(out: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)


def test_force_refuses_a_folder_holding_files_the_quickstart_did_not_write(tmp_path):
    """The reported case: an eval JSON and a plots/ folder added to an earlier run's folder."""
    out = tmp_path / "quickstart-smollm2"
    _fill(out, {**OWN, "eval/mine.json": "{}", "plots/x.png": "png", "notes.md": "n", "extra.txt": "e"})
    before = tree_hashes(out)
    run = _quickstart(out)
    assert run.returncode == 2, run.stderr
    line = run.stderr.strip()
    assert "holds 4 file(s) the quickstart did not write (eval/mine.json, extra.txt, notes.md and 1 more)" in line
    assert "move them out of it, or choose another --out" in line
    assert tree_hashes(out) == before


def test_force_reruns_into_a_folder_of_its_own(tmp_path):
    """The variant: only the quickstart's own entries: past the check (to the missing surgery), nothing
    deleted; the surgery steps then get --force."""
    out = tmp_path / "quickstart-smollm2"
    _fill(out, OWN)
    run = _quickstart(out)
    assert run.returncode == 2 and "surgery is not installed" in run.stderr, run.stderr
    assert set(tree_hashes(out)) >= set(OWN)
    script = (REPO / "examples" / "quickstart.sh").read_text()
    for folder in ("pruned", "amplified", "adapter", "report"):
        assert f'--out "$OUT/{folder}" "${{FORCE_OUT[@]}}"' in script, folder
