"""Train the tiny Mixtral with a planted bias in one expert and write everything its proof needs.

    python examples/train_moe_bias_model.py --out tests/fixtures/moe_bias_model

Writes, in --out: the checkpoint (safetensors + config) and its word-level tokenizer,
``training.json`` (configuration, wall time, accuracy, capability margin and bias gap),
``pairs.jsonl`` (the task's pairs for ``surgery find-neurons --pairs``) and ``ground_truth.json``:
each expert silenced in every layer, and each of the expert neurons zeroed alone, with its effect
on the bias gap, the absolute gap and the capability margin (in % of the intact model's).

The model is shipped, not retrained by the proof: training is bit-reproducible on one kind of CPU
only (tests/planted/common.same_float_path), and the proof checks what find-neurons makes of this
model, not which solution a CPU's float path lands on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the task and the training loop live in tests/planted/

# One thread: the matrices are tiny, and on a shared CPU extra threads spin instead of working.
import torch  # noqa: E402

torch.set_num_threads(1)

from tests.planted.bias_brute import BiasProbe  # noqa: E402
from tests.planted.bias_task import pair_rows  # noqa: E402
from tests.planted.common import add_config_options, config_from  # noqa: E402
from tests.planted.moe_bias_brute import brute_force  # noqa: E402
from tests.planted.moe_bias_train import MoeBiasTrainConfig, train  # noqa: E402


def ground_truth(out: Path, cfg: MoeBiasTrainConfig) -> dict:
    """Brute force on the saved checkpoint, as stock transformers loads it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out).eval()
    return brute_force(model, AutoTokenizer.from_pretrained(out), BiasProbe(cfg.world()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="Output folder (created).")
    add_config_options(parser, MoeBiasTrainConfig)
    args = parser.parse_args()
    cfg = config_from(args, MoeBiasTrainConfig)
    args.out.mkdir(parents=True, exist_ok=True)
    stats = train(args.out, cfg)
    rows = pair_rows(cfg.world())
    (args.out / "pairs.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    truth = ground_truth(args.out, cfg)
    (args.out / "ground_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    print(f"trained {stats['parameters']} parameters in {stats['train_seconds']} s: {stats['eval']}")
    print(f"brute force on {truth['pairs']} pairs: {truth['intact']}")
    for r in truth["experts"]:
        print(f"  expert {r['expert']} silenced: bias {r['bias']:6.1f} %   capability {r['capability']:6.1f} %")
    for r in truth["neurons"][:10]:
        print(
            f"  neuron {r['layer']}:e{r['expert']}:{r['neuron']}: bias {r['bias']:6.1f} %   "
            f"|gap| {r['abs_bias']:6.1f} %   capability {r['capability']:6.1f} %"
        )


if __name__ == "__main__":
    main()
