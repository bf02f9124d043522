#!/usr/bin/env python3
"""Write the ready recipes in recipes/ from a quickstart output folder.

    bash examples/quickstart.sh --model smollm2 --out quickstart-smollm2
    python examples/make_recipes.py quickstart-smollm2 --model smollm2

Each recipe is the edit the quickstart baked (read back from the checkpoint's surgery.json), with a
comment header: how to reproduce it, the findings behind it and the eval numbers measured on the
baked checkpoint. ``surgery apply recipes/FILE.yaml --model MODEL --out DIR`` bakes it again.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from surgery.core.edits import Recipe
from surgery.find.heads.params import FindParams

# find-heads parameters a user can set on the command line (the findings record them all)
HEAD_FLAGS = ("benchmark", "max_pairs", "per_identity", "seed", "knockout_heads", "confirm", "random_sets")

MODELS = {  # quickstart --model → (Hub id recorded as base_model, file prefix)
    "smollm2": ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m-instruct"),
    "gemma": ("google/gemma-3-270m", "gemma-3-270m"),
}


def _read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _num(x: Any, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def eval_lines(ev: dict[str, Any] | None) -> list[str]:
    """Eval numbers of the baked checkpoint against its source (quickstart's eval/*.json)."""
    if not ev:
        return ["Eval: not measured by this run."]
    m, a = ev["metrics"]["model"], ev["metrics"].get("against", {})
    kept = ev.get("retained_pct") or {}
    source = Path(ev["against"]["path"])
    imported = _read(source / "surgery.gguf.json")  # examples/get_models.py's models are GGUF imports
    return [
        f"Eval (surgery eval --against the source, {ev['settings']['items']['passages']} passages, "
        f"{ev['settings']['items']['mcq']} MCQs, {ev['settings']['items']['prompts']} KL prompts; "
        f"{ev['created'][:10]}):",
        f"  source {source.name}"
        + (f", {imported['gguf']['file']} imported as {imported['dtype']}" if imported else "")
        + ";",
        "  tests/core/test_recipe_evals.py (-m slow) measures these again:",
        f"  perplexity {_num(a.get('perplexity'), 4)} -> {_num(m.get('perplexity'), 4)} "
        f"({_num(kept.get('perplexity'), 4)} % retained)",
        f"  MCQ accuracy {_num(a.get('mcq_accuracy'))} -> {_num(m.get('mcq_accuracy'))} "
        f"({_num(kept.get('mcq_accuracy'), 4)} % retained)",
        f"  KL(source || edited) {_num(m.get('kl_mean'))}, top-1 agreement {_num(m.get('top1_agreement'))}",
    ]


def neuron_lines(prov: dict[str, Any]) -> list[str]:
    sel, found = prov["neuron_selection"], prov["neuron_findings"]
    layers: dict[int, int] = {}
    for n in sel["neurons"]:
        layers[n["layer"]] = layers.get(n["layer"], 0) + 1
    cats: dict[str, int] = {}
    for n in sel["neurons"]:
        cats[n["chosen_for"]] = cats.get(n["chosen_for"], 0) + 1
    ds = found["dataset"]
    return [
        f"Findings: {ds['pairs_used']} of {ds['pairs']} contrastive pairs ({ds['source']}), "
        f"score {sel['score']} (bias weight {sel['bias_weight']}), rule {sel['rule']}, "
        f"spare-active {sel['spare_active']}.",
        "  neurons per layer: " + ", ".join(f"{k}: {v}" for k, v in sorted(layers.items())),
        "  chosen for: " + ", ".join(f"{k} {v}" for k, v in sorted(cats.items())),
    ]


def head_lines(findings: dict[str, Any]) -> list[str]:
    s, disc = findings["scores"]["S"], findings["discovery"]
    ko, rnd = findings["knockout"]["tested"], findings["knockout"]["random"]
    conf = findings.get("confirmation") or {}
    heads = ", ".join(f"{l}.{h}" for l, h in findings["selected_heads"])
    lines = [
        f"Findings: {findings['pairs']['n']} match/mismatch pairs over {findings['pairs']['items']} items "
        f"({findings['pairs']['benchmark']} benchmark), {findings['prompt_format']} prompts.",
        f"  dS = {_num(s['delta'])} (paired t-test p = {_num(s['p'])}); discovery CV AUC {_num(disc['auc'])}",
        f"  selected heads {heads}"
        + (f" ({conf['n_significant']} of {conf['candidates']} single-head knockouts significant)" if conf else ""),
        f"  edge knockout of the selection: {_num(ko['effect_pct'])} % of dS removed "
        f"(95 % CI {_num(ko['ci95'][0])} to {_num(ko['ci95'][1])}); {rnd['n']} random head sets: "
        f"mean {_num(rnd['mean_pct'])} %",
    ]
    if not (s["p"] is not None and s["p"] < 0.05):  # NaN or None: no test possible
        lines.append("  dS is not significant on this model: the knockout % is not interpretable and the")
        lines.append("  heads are the best candidates, not a demonstrated binding circuit.")
    return lines


def head_options(findings: dict[str, Any]) -> str:
    """The amplify-heads options that reproduce these findings (those not at their default)."""
    params, defaults = findings["parameters"], FindParams()
    return "".join(f" --{k.replace('_', '-')} {params[k]}" for k in HEAD_FLAGS if params.get(k) != getattr(defaults, k))


def write(path: Path, recipe: Recipe, header: list[str]) -> None:
    path.write_text(recipe.to_yaml("\n".join(header)), encoding="utf-8")
    assert Recipe.load(path).edits == recipe.edits  # reads back to the same edit
    print(f"wrote {path} ({len(recipe.edits)} edits)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="a quickstart output folder")
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "recipes")
    args = ap.parse_args()
    hub_id, prefix = MODELS[args.model]
    args.out.mkdir(parents=True, exist_ok=True)
    timings = (args.folder / "timings.tsv").read_text(encoding="utf-8").splitlines()
    total = next(line.split("\t")[1] for line in timings if line.startswith("total\t"))
    reproduce = [
        f"Reproduce: bash examples/quickstart.sh --model {args.model} --out quickstart-{args.model}",
        f"           python examples/make_recipes.py quickstart-{args.model} --model {args.model}",
        # the run that made this recipe, not a promise: later code may be faster
        f"(the quickstart run that made this recipe: {float(total) / 60:.0f} min wall on 2 CPU cores;",
        " current timings: docs/performance.md)",
    ]

    pruned = _read(args.folder / "pruned" / "surgery.json")
    recipe = Recipe.from_dict({**pruned["recipe"], "base_model": hub_id})
    write(
        args.out / f"{prefix}-prune40.yaml",
        recipe,
        [
            f"{hub_id}: the 40 fairness-pruning neurons (gate/up rows and down column zeroed).",
            f"Apply: surgery apply recipes/{prefix}-prune40.yaml --model MODEL --out DIR",
            *reproduce,
            "Same edit directly: surgery prune-neurons MODEL --n 40 --out DIR",
            "",
            *neuron_lines(pruned),
            "",
            *eval_lines(_read(args.folder / "eval" / "pruned.json")),
        ],
    )

    amplified = _read(args.folder / "amplified" / "surgery.json")
    heads = _read(args.folder / "findings" / "heads.json")
    recipe = Recipe.from_dict({**amplified["recipe"], "base_model": hub_id})
    alpha = recipe.edits[0].alpha
    write(
        args.out / f"{prefix}-heads-alpha{alpha:g}.yaml",
        recipe,
        [
            f"{hub_id}: the top {len(recipe.edits)} cultural binding heads, o_proj columns x {alpha:g}.",
            f"Apply: surgery apply recipes/{prefix}-heads-alpha{alpha:g}.yaml --model MODEL --out DIR",
            *reproduce,
            f"Same edit directly: surgery amplify-heads MODEL --alpha {alpha:g} --top {len(recipe.edits)}"
            f"{head_options(heads)} --out DIR",
            "",
            *head_lines(heads),
            "",
            *eval_lines(_read(args.folder / "eval" / "amplified.json")),
        ],
    )


if __name__ == "__main__":
    main()
