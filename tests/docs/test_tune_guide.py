"""docs/guides/tune.md's Python block runs as written, in minutes on a CPU, and shows its progress: it
tuned 40 trials over every pair of the benchmark before (hours on a CPU, silent while it measured),
from a findings file the page never made. Here in a home whose page path holds a 3-layer model with
the tests' character tokenizer, its find-heads findings cached first, as the block's comment asks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.cli import cli_env
from tests.support.paths import REPO
from tests.support.tiny import build_tiny
from tests.support.tokenizer import TINY_VOCAB, save_char_tokenizer

PAGE = REPO / "docs" / "guides" / "tune.md"
MODEL = Path(".cache/surgery/models/smollm2-135m-instruct")  # under HOME, as the page names it


def _run(code: str, home: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = cli_env(HOME=str(home), SURGERY_CACHE=str(home / ".cache" / "surgery"))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def test_the_python_block_runs_as_written_and_shows_its_progress(tmp_path):
    (block,) = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    save_char_tokenizer(build_tiny("llama", home / MODEL, vocab_size=TINY_VOCAB))
    found = _run(
        f"import surgery; surgery.find_heads({str(home / MODEL)!r}, max_pairs=8, random_sets=1, device='cpu')",
        home,
        work,
    )
    assert found.returncode == 0, found.stderr
    run = _run(block, home, work)
    assert run.returncode == 0, run.stderr
    assert "trial 7 (8/8)" in run.stdout, run.stdout  # report=print: a line per trial
    assert "baseline passes (tune split)" in run.stderr, run.stderr  # progress: tqdm's bars
    assert (work / "tuned" / "surgery.json").is_file()
