"""Train the tiny Llama with a planted bias in its MLP neurons and write everything the proof needs.

    python examples/train_bias_model.py --out tests/fixtures/bias_model

Writes, in --out: the checkpoint (safetensors + config) and its word-level tokenizer,
``training.json`` (configuration, wall time, accuracy, capability margin and bias gap),
``pairs.jsonl`` (the task's contrastive pairs in surgery's own pairs format, for
``surgery find-neurons --pairs``) and ``ground_truth.json`` (every MLP neuron zeroed alone: its
effect on the bias gap, the absolute gap and the capability margin, in % of the intact model's).
The task, training loop and brute force live in tests/planted/bias_*.py and use no surgery
analysis code (only the run-time neuron hook, to zero a neuron).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the task and the training loop live in tests/planted/

# One thread: the matrices are tiny, and on a shared CPU extra threads spin instead of working.
import torch  # noqa: E402

torch.set_num_threads(1)

from tests.planted.bias_brute import BiasProbe, brute_force  # noqa: E402
from tests.planted.bias_task import pair_rows  # noqa: E402
from tests.planted.bias_train import BiasTrainConfig, train  # noqa: E402
from tests.planted.common import add_config_options, config_from  # noqa: E402


def write_pairs(cfg: BiasTrainConfig, path: Path) -> Path:
    """The task's pairs as surgery's pairs JSONL."""
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in pair_rows(cfg.world())), encoding="utf-8")
    return path


def ground_truth(out: Path, cfg: BiasTrainConfig) -> dict:
    """Brute-force effects of every neuron, largest bias effect first."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    probe = BiasProbe(cfg.world())
    base, rows = brute_force(model, tokenizer, probe)
    return {"pairs": len(probe.pairs), "intact": asdict(base), "neurons": [asdict(r) for r in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="Output folder (created).")
    add_config_options(parser, BiasTrainConfig)
    args = parser.parse_args()
    cfg = config_from(args, BiasTrainConfig)
    args.out.mkdir(parents=True, exist_ok=True)
    stats = train(args.out, cfg)
    write_pairs(cfg, args.out / "pairs.jsonl")
    truth = ground_truth(args.out, cfg)
    (args.out / "ground_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    print(f"trained {stats['parameters']} parameters in {stats['train_seconds']} s: {stats['eval']}")
    print(f"brute force on {truth['pairs']} pairs: {truth['intact']}")
    for r in truth["neurons"][:10]:
        print(
            f"  neuron {r['layer']}:{r['neuron']}: bias {r['bias']:6.1f} %   |gap| {r['abs_bias']:6.1f} %   "
            f"capability {r['capability']:6.1f} %"
        )


if __name__ == "__main__":
    main()
