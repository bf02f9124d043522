"""Every command that loads a model, as arguments on a tiny checkpoint with small inputs."""

from __future__ import annotations

from pathlib import Path

from tests.support.binding import write_small_benchmark
from tests.support.neuron_pairs import write_pairs

# find-heads on the small benchmark without the knockout confirmation: 4 pairs, one random set.
FAST_HEADS = ["--max-pairs", "4", "--random-sets", "1", "--confirm", "0"]


def model_commands(model: Path, tmp: Path) -> dict[str, list]:
    """Each command that loads a model, by name: its arguments on ``model``, inputs and outputs under ``tmp``."""
    bench = write_small_benchmark(tmp / "small.jsonl")
    pairs = write_pairs(tmp / "pairs.jsonl")
    recipe = tmp / "recipe.yaml"
    recipe.write_text("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: 2.0}\n")
    return {
        "find-neurons": ["find-neurons", model, "--pairs", pairs],
        "prune-neurons": ["prune-neurons", model, "--n", "2", "--pairs", pairs, "--out", tmp / "pruned"],
        "score-binding": ["score-binding", model, "--benchmark", bench, "--max-pairs", "4"],
        "find-heads": ["find-heads", model, "--benchmark", bench, *FAST_HEADS],
        "amplify-heads": [
            "amplify-heads",
            model,
            "--alpha",
            "2",
            "--top",
            "1",
            "--benchmark",
            bench,
            *FAST_HEADS,
            "--out",
            tmp / "amplified",
        ],
        "apply": ["apply", recipe, "--model", model, "--out", tmp / "applied"],
        "verify": ["verify", model, tmp / "applied"],
        "eval": ["eval", model, "--against", tmp / "applied", "--limit", "1", "--suite", "kl"],
    }
