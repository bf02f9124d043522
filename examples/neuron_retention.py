"""Which neuron-selection defaults keep a model working? Retention of every score × rule × spare.

For each way of choosing n neurons from the (cached) findings, the neurons are zeroed at run time
(the same edit `prune-neurons` bakes, see surgery/model/hooks.py) and the model is measured on:
perplexity of the shipped neutral passages, P(" Paris" | "The capital of France is") and whether
Paris is still the top token, and optionally general-knowledge MCQ accuracy and BBQ bias (external
data, read at run time). A random set of n neurons is the control.

    python examples/neuron_retention.py ~/.cache/surgery/models/smollm2-135m-instruct --n 40 --mcq 100
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
from machine import stamp

from surgery.core.checkpoint import Checkpoint
from surgery.core.edits import NeuronScale
from surgery.evaluation import lm
from surgery.evaluation.data import bbq_data, shipped
from surgery.find.neurons.find import find_neurons
from surgery.find.neurons.pairs import load_pairs
from surgery.find.neurons.scores import SCORES
from surgery.find.neurons.select import DEFAULT_RULE, DEFAULT_SCORE, DEFAULT_SPARE, RULES, select
from surgery.model.hooks import applied
from surgery.model.loading import load_model, load_tokenizer

PARIS_PROMPT = "The capital of France is"
BBQ_DIR = Path(os.environ.get("SURGERY_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")) / "bbq"


def measure(model, tok, edits, passages, mcq, bbq) -> dict:
    """Retention numbers with ``edits`` applied as run-time hooks."""
    from surgery.evaluation.suites import bbq as bbq_eval
    from surgery.evaluation.suites import mcq_accuracy

    def no_progress(description, total):
        return lambda n=1: None

    paris = tok(" Paris", add_special_tokens=False)["input_ids"][0]
    with applied(model, edits), torch.inference_mode():
        ppl = lm.perplexity(model, tok, passages)["perplexity"]
        ids = tok(PARIS_PROMPT, return_tensors="pt")["input_ids"]
        logp = torch.log_softmax(model(input_ids=ids).logits[0, -1].float(), -1)
        greedy = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
        row = {
            "perplexity": ppl,
            "p_paris": float(logp[paris].exp()),
            "paris_top1": int(logp.argmax()) == paris,
            "continuation": tok.decode(greedy[0, ids.shape[1] :]),
        }
        if mcq:
            row["mcq_accuracy"] = mcq_accuracy(model, tok, mcq, 8, no_progress)["accuracy"]
        if bbq:
            result = bbq_eval(model, tok, bbq, 8, no_progress)
            row.update(bbq_acc_ambig=result.get("acc_ambig"), bbq_bias_ambig=result.get("bias_ambig"))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--pairs", default="builtin")
    ap.add_argument("--language", default=None)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--mcq", type=int, default=0, help="Shipped MCQ questions to score (0: skip).")
    ap.add_argument("--bbq", type=int, default=0, help="BBQ items from ../shared/data/bbq (0: skip).")
    ap.add_argument(
        "--grid",
        choices=["full", "short"],
        default="full",
        help="full: every score × rule × spare; short: the raw BiasScore (global, no spare) and the defaults.",
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    machine = stamp()

    ckpt = Checkpoint(args.model)
    start = time.perf_counter()
    found = find_neurons(ckpt, load_pairs(args.pairs, args.language))
    print(
        f"findings ({'cache' if found.from_cache else 'computed'}, {time.perf_counter() - start:.1f} s): {found.path}"
    )
    model, tok = load_model(args.model), load_tokenizer(args.model)
    passages = [r["text"] for r in shipped("retention_passages.jsonl")]
    mcq = shipped("mcq_general.jsonl")[: args.mcq] if args.mcq else []
    bbq = bbq_data([BBQ_DIR], args.bbq) if args.bbq and BBQ_DIR.is_dir() else []

    layers, width = found.scores.shape
    rng = np.random.default_rng(0)
    configs = [("baseline", None), ("random", rng.choice(layers * width, args.n, replace=False))]
    if args.grid == "full":
        configs += [
            ((score, rule, spare), None) for spare in (0.0, DEFAULT_SPARE) for score in SCORES for rule in RULES
        ]
    else:
        configs += [(("bias", "global", 0.0), None), ((DEFAULT_SCORE, DEFAULT_RULE, DEFAULT_SPARE), None)]
    rows = []
    for name, random_ids in configs:
        if name == "baseline":
            neurons, label = [], "baseline (no edit)"
        elif name == "random":
            neurons, label = [(int(i) // width, int(i) % width) for i in random_ids], f"random {args.n}"
        else:
            score, rule, spare = name
            neurons = list(select(found.scores, args.n, score=score, rule=rule, spare_active=spare).neurons)
            label = f"{score:<8} {rule:<12} spare {spare:g}"
        dist = [0] * layers
        for layer, _ in neurons:
            dist[layer] += 1
        row = {
            "config": label,
            "last_layer": dist[-1],
            "layers_used": sum(1 for c in dist if c),
            **measure(model, tok, [NeuronScale(l, i, 0.0) for l, i in neurons], passages, mcq, bbq),
        }
        rows.append(row)
        base = rows[0]["perplexity"]
        extra = "".join(f"  {k} {row[k]:.3f}" for k in ("mcq_accuracy", "bbq_acc_ambig", "bbq_bias_ambig") if k in row)
        print(
            f"{label:<34} ppl {row['perplexity']:8.2f} ({row['perplexity'] / base:5.2f}×)  "
            f"P(Paris) {row['p_paris']:.3f}  top1 {'yes' if row['paris_top1'] else 'NO '}  "
            f"last layer {row['last_layer']:>2}  layers {row['layers_used']:>2}{extra}  {row['continuation']!r}"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"machine": machine, "model": str(args.model), "n": args.n, "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
