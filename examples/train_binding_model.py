"""Train the tiny Llama with a planted binding circuit and write everything the proof needs.

    python examples/train_binding_model.py --out tests/fixtures/binding_model
    python examples/train_binding_model.py --seed 0 --heads 4 --head-dim 4 --out tests/fixtures/binding_decoy
    python examples/train_binding_model.py --dose-head 3 --dose-share 0.8 --out tests/fixtures/binding_dose

The second is the decoy of tests/find/heads/test_planted_decoy.py: its circuit is in layer 0, but discovery
alone ranks later "reader" heads first; find-heads' knockout confirmation must recover the circuit.
The third has one specific binding head with a planted whole-head dose-response
(tests/find/heads/test_planted_amplify.py: the amplify-heads bake raises |ΔS|).

Writes, in --out: the checkpoint (safetensors + config) and its tokenizer, ``training.json``
(configuration, wall time, task accuracy and ΔS), ``benchmark.jsonl`` (the task in surgery's
benchmark format, for ``surgery find-heads --benchmark``) and ``ground_truth.json`` (every head's
brute-force effect on ΔS: identity→item edge knockout, distractor control, whole-head α = 0).
The task, training loop and brute force live in tests/planted/ and use no surgery analysis code.
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

from tests.planted.bench import write_benchmark  # noqa: E402
from tests.planted.brute import GROUND_TRUTH_SEED, Prompts, brute_force, eval_pairs  # noqa: E402
from tests.planted.common import add_config_options, config_from  # noqa: E402
from tests.planted.reference import ATTN_NAME, register  # noqa: E402
from tests.planted.task import make_world  # noqa: E402
from tests.planted.train import TrainConfig, train  # noqa: E402


def ground_truth(out: Path, cfg: TrainConfig, per_item: int) -> dict:
    """Brute-force effects of every head on ΔS, largest identity→item edge effect first."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    register()
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, attn_implementation=ATTN_NAME).eval()
    world = make_world(cfg.seed, cfg.n_items, cfg.n_neutral, cfg.n_neutral_items)
    prompts = Prompts.build(tokenizer, eval_pairs(world, GROUND_TRUTH_SEED, per_item))
    base, rows = brute_force(model, tokenizer, prompts)
    return {"delta_S": base, "pairs": prompts.n_pairs, "seed": GROUND_TRUTH_SEED, "heads": [asdict(r) for r in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="Output folder (created).")
    add_config_options(parser, TrainConfig)
    parser.add_argument("--per-item", type=int, default=6, help="Pairs per item for the brute force.")
    args = parser.parse_args()
    cfg = config_from(args, TrainConfig)
    args.out.mkdir(parents=True, exist_ok=True)
    stats = train(args.out, cfg)
    world = make_world(cfg.seed, cfg.n_items, cfg.n_neutral, cfg.n_neutral_items)
    write_benchmark(world, args.out / "benchmark.jsonl")
    truth = ground_truth(args.out, cfg, args.per_item)
    (args.out / "ground_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    print(f"trained {stats['parameters']} parameters in {stats['train_seconds']} s: {stats['eval']}")
    print(f"brute force on {truth['pairs']} pairs, ΔS = {truth['delta_S']:+.3f}")
    for r in truth["heads"]:
        print(
            f"  head {r['layer']}.{r['head']}: edge knockout {r['edge']:6.1f} %   control "
            f"{r['edge_control']:6.1f} %   whole head α=0 {r['whole']:6.1f} %"
        )


if __name__ == "__main__":
    main()
