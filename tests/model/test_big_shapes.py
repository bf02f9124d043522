"""The whole pipeline at Llama-3.1-8B's shapes (hidden 4096, MLP 14336, 32 heads, 8 KV heads,
head_dim 128, vocab 128256), 4 layers deep (3.9 GB of random bf16 weights), in bounded memory.

find-neurons, find-heads, prune-neurons (bake + its check), amplify-heads and verify run as a user
runs them, in bfloat16 on the CPU. Each command's anonymous memory (what the process itself holds;
the weights transformers maps from the safetensors files are file pages the kernel can drop) stays
below the checkpoint's size. The peaks are printed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.support.binding import write_small_benchmark
from tests.support.cli import cli_env
from tests.support.neuron_pairs import write_pairs
from tests.support.paths import REPO

sys.path.insert(0, str(REPO / "examples"))
from measure import run_measured  # noqa: E402
from synthetic_checkpoint import build  # noqa: E402

pytestmark = pytest.mark.slow(minutes=6)
MODELS = Path(os.environ.get("SURGERY_MODELS", Path.home() / ".cache" / "surgery" / "models"))
GB = 1e9


@pytest.fixture(scope="module")
def big() -> Path:
    return build(MODELS / "llama-3.1-8b-shapes-4l", layers=4)


def test_find_bake_verify_at_8b_shapes_in_bounded_memory(big, tmp_path):
    size = sum(p.stat().st_size for p in big.glob("*.safetensors"))
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    bench = write_small_benchmark(tmp_path / "small.jsonl")
    env = cli_env(SURGERY_CACHE=str(tmp_path / "cache"))
    bf16 = ["--dtype", "bfloat16"]
    steps = {
        "find-neurons": ["find-neurons", big, "--pairs", pairs, *bf16, "--json"],
        "find-heads": [
            "find-heads",
            big,
            "--benchmark",
            bench,
            "--max-pairs",
            "4",
            "--random-sets",
            "1",
            "--confirm",
            "0",
            *bf16,
            "--out",
            tmp_path / "heads.json",
        ],
        "prune-neurons": ["prune-neurons", big, "--n", "40", "--pairs", pairs, *bf16, "--out", tmp_path / "pruned"],
        "amplify-heads": [
            "amplify-heads",
            big,
            "--findings",
            tmp_path / "heads.json",
            "--top",
            "2",
            "--alpha",
            "2.5",
            *bf16,
            "--out",
            tmp_path / "amplified",
        ],
        "verify": ["verify", big, tmp_path / "pruned", *bf16, "--json"],
    }
    peaks = {}
    for name, args in steps.items():
        res, peak = run_measured([sys.executable, "-m", "surgery", *map(str, args)], env=env, cwd=REPO)
        assert res.returncode == 0, f"{name}: {res.stderr[-3000:]}"
        peaks[name] = peak
        print(
            f"{name}: peak RSS {peak.rss_bytes / GB:.2f} GB, anonymous {peak.anon_bytes / GB:.2f} GB "
            f"(checkpoint {size / GB:.2f} GB)"
        )
    report = json.loads(res.stdout)  # verify's
    assert report["ok"], report
    recipe = json.loads((tmp_path / "pruned" / "surgery.json").read_text())["recipe"]["edits"]
    assert len(recipe) == 40 and all(e["type"] == "neuron" for e in recipe)
    for name, peak in peaks.items():
        assert peak.anon_bytes < size, (
            f"{name} held {peak.anon_bytes / GB:.2f} GB, the checkpoint is {size / GB:.2f} GB"
        )
