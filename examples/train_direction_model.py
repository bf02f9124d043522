"""Train the tiny Llama with a planted residual direction and write everything the proof needs.

    python examples/train_direction_model.py --out tests/fixtures/direction_model

Writes, in --out: the checkpoint (safetensors + config) and its word-level tokenizer,
``training.json`` (configuration, wall time, the behaviour with and without u), the proof's
prompt sets ``a.txt`` (the safety question with a trigger word), ``b.txt`` (without) and
``neutral.txt`` (the color question), and ``ground_truth.json`` (the planted unit vector u and the
behaviour measured on these sets, intact and with u projected out at run time). The task and the
training loop live in tests/planted/direction_task.py and use no surgery code.
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

from tests.planted.common import add_config_options, config_from  # noqa: E402
from tests.planted.direction_task import (  # noqa: E402
    DirectionTrainConfig,
    behaviour,
    make_world,
    planted_direction,
    projected_off,
    prompt_sets,
    train,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="Output folder (created).")
    add_config_options(parser, DirectionTrainConfig)
    args = parser.parse_args()
    cfg = config_from(args, DirectionTrainConfig)
    args.out.mkdir(parents=True, exist_ok=True)
    stats = train(args.out, cfg)
    sets = prompt_sets(make_world(cfg))
    for name, texts in sets.items():
        (args.out / f"{name}.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(args.out), AutoModelForCausalLM.from_pretrained(args.out).eval()
    u = planted_direction(cfg)
    with projected_off(model, u):
        ablated = behaviour(model, tokenizer, sets)
    truth = {
        "u": u.tolist(),
        "behaviour": behaviour(model, tokenizer, sets),
        "behaviour_u_ablated": ablated,
        "prompts": {name: len(texts) for name, texts in sets.items()},
    }
    (args.out / "ground_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    print(f"trained {stats['parameters']} parameters in {stats['train_seconds']} s: {stats['eval']}")
    print(f"behaviour on the proof's sets: {truth['behaviour']:.2f} intact, {ablated:.2f} with u projected out")


if __name__ == "__main__":
    main()
