"""The real-model measurement of a direction edit: SmolLM2-135M-Instruct, Spanish vs English.

    python examples/get_models.py --only smollm2
    python examples/direction_smollm2.py [--model DIR] [--out DIR] [--direction-layer L]

The contrast is ours (examples/directions/): the same 48 everyday questions in Spanish (``--a``)
and in English (``--b``); the behaviour is answering in Spanish. The script finds the per-layer
directions, bakes the chosen layer's direction out of every attention and MLP output matrix
(weight 1), and measures, against the source: the share of greedy answers to 24 held-out Spanish
questions that contain a Spanish marker word (examples/directions/spanish_markers.txt), and the
first-token KL on the shipped neutral prompts per language. It prints one table and writes
``summary.json`` in --out. Wall time on 2 CPU cores: a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent / "directions"
MODELS = Path(os.environ.get("SURGERY_MODELS", Path.home() / ".cache" / "surgery" / "models"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MODELS / "smollm2-135m-instruct")
    parser.add_argument("--out", type=Path, default=Path("direction-smollm2"))
    parser.add_argument(
        "--direction-layer",
        type=int,
        default=None,
        help="The layer whose direction is ablated everywhere (default: the best-separating one).",
    )
    parser.add_argument("--per-layer", action="store_true", help="Each layer its own direction instead.")
    parser.add_argument("--weight", type=float, default=1.0, help="ablate-direction --weight (negative: amplify).")
    parser.add_argument("--layers", default=None, help="ablate-direction --layers (default: every layer).")
    args = parser.parse_args()

    import surgery

    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    found = surgery.find_direction(
        args.model,
        a=HERE / "es_questions.txt",
        b=HERE / "en_questions.txt",
        out=args.out / "direction.json",
        device="cpu",
    )
    found_s = time.perf_counter() - start
    layer = found.data.best_layer if args.direction_layer is None else args.direction_layer
    start = time.perf_counter()
    baked = surgery.ablate_direction(
        args.model,
        args.out / "ablated",
        direction=args.out / "direction.json",
        direction_layer=None if args.per_layer else layer,
        weight=args.weight,
        layers=args.layers,
        device="cpu",
        bake=surgery.BakeOptions(force=True),
    )
    bake_s = time.perf_counter() - start
    result = surgery.evaluate(
        args.out / "ablated",
        against=args.model,
        prompts=HERE / "es_heldout.txt",
        markers=HERE / "spanish_markers.txt",
        suites=("kl", "markers"),
        max_new_tokens=32,
        device="cpu",
        out=args.out / "eval.json",
    )
    before, after = result.metrics.against, result.metrics.model
    first = result.details.model["kl"]["first_token"]
    left = [e.direction_left for e in baked.provenance.edited_tensors if e.direction_left is not None]
    row = found.data.layers[layer]
    summary = {
        "model": str(args.model),
        "direction_layer": None if args.per_layer else layer,
        "weight": args.weight,
        "layers": args.layers,
        "best_layer": found.data.best_layer,
        "separation": row.separation,
        "accuracy": row.accuracy,
        "spanish_answers_before": before["marker_rate"],
        "spanish_answers_after": after["marker_rate"],
        "first_token_kl": first,
        "kl_mean_all_positions": after["kl_mean"],
        "direction_left_max": max(left),
        "direction_left_mean": sum(left) / len(left),
        "matrices": len(left),
        "find_seconds": round(found_s, 1),
        "bake_seconds": round(bake_s, 1),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"direction of layer {layer} (best separation: layer {summary['best_layer']}, d = {row.separation:.2f}, "
        f"accuracy {100 * row.accuracy:.0f} %)"
    )
    print(
        f"answers to held-out Spanish questions with a Spanish marker: {100 * before['marker_rate']:.0f} % → "
        f"{100 * after['marker_rate']:.0f} %"
    )
    for lang, s in first["per_language"].items():
        print(f"first-token KL on neutral {lang} prompts: mean {s['mean']:.3g}, p95 {s['p95']:.3g}, p99 {s['p99']:.3g}")
    print(
        f"direction left after rounding: mean {100 * summary['direction_left_mean']:.3g} %, max "
        f"{100 * summary['direction_left_max']:.3g} % over {len(left)} matrices; find {found_s:.0f} s, bake {bake_s:.0f} s"
    )


if __name__ == "__main__":
    main()
