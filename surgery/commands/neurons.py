"""Neuron commands: find-neurons (findings computed once) and prune-neurons (bake any n from them)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import click

from ..cli import cli
from ..console import err, out, print_json, progress_bars
from ..edits import NeuronScale, Recipe, parse_neurons
from ..errors import RecipeError
from ..models import LoadSpec
from ..neuron_select import DEFAULT_RULE, DEFAULT_SCORE, DEFAULT_SPARE, RULES, select
from ..neurons import DEFAULT_BIAS_WEIGHT, SCORES
from .common import baking_command, model_argument, parse_values, run_bake, run_sweep, sweep_label
from .neuron_views import dataset_brief, print_summary, selection_extra


def _categories(values: tuple[str, ...]) -> list[str] | None:
    """--category may be repeated or comma-separated."""
    names = [c.strip() for v in values for c in v.split(",") if c.strip()]
    return names or None


def parse_layers(spec: str | None) -> list[int] | None:
    """``"20-29"`` or ``"0,5,28-29"`` → layer list (None: every layer)."""
    if not spec:
        return None
    layers: list[int] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        try:
            lo, _, hi = part.partition("-")
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise RecipeError(f"--layers: '{part}' is not a layer or a range like 20-29") from None
        if first > last:
            raise RecipeError(f"--layers: range '{part}' runs backwards; write {last}-{first}")
        layers.extend(range(first, last + 1))
    return sorted(set(layers))


def pair_options(f: Callable) -> Callable:
    """Where the prompt pairs come from and how findings are computed."""
    options = [
        click.option("--pairs", "pairs_source", default="builtin", show_default=True,
                     help="'builtin' (our EN/ES sets), our JSONL format, or the public fairness-pruning JSON."),
        click.option("--language", type=click.Choice(["en", "es"]), default=None,
                     help="Language of the pairs (builtin default: en; files: all languages)."),
        click.option("--category", "categories", multiple=True,
                     help="Only these categories (repeat or comma-separate), e.g. Gender,Religion."),
        click.option("--strict", is_flag=True,
                     help="Pairs whose prompts tokenize to different lengths are an error, not skipped."),
        click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True,
                     help="Pairs per forward pass."),
        click.option("--recompute", is_flag=True, help="Ignore cached findings and capture again."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def selection_options(f: Callable) -> Callable:
    """How neurons are ranked and chosen from findings."""
    options = [
        click.option("--score", type=click.Choice(SCORES), default=DEFAULT_SCORE, show_default=True,
                     help="bias: mean |Δ activation|; signed: |mean (stereotyped − other)|; fairness: "
                          "per-layer min-max of bias, weighted against PPM."),
        click.option("--select", "rule", type=click.Choice(RULES), default=DEFAULT_RULE, show_default=True,
                     help="global: top n pooled; per-category: each category's best in turn; "
                          "intersection: neurons in every category's top list."),
        click.option("--bias-weight", type=click.FloatRange(0, 1), default=DEFAULT_BIAS_WEIGHT,
                     show_default=True, help="w of the fairness score: w·bias + (1 − w)·(1 − PPM)."),
        click.option("--layers", "layer_spec", default=None, help="Only these layers, e.g. 20-29 or 0,5,28-29."),
        click.option("--spare-active", type=click.FloatRange(0, 1, max_open=True), default=DEFAULT_SPARE,
                     show_default=True, help="Never choose this fraction of each layer's most active neurons "
                     "(massive activations: removing them breaks the model); 0 turns it off."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _findings(model: str, load: LoadSpec, kw: dict[str, Any], findings_file: Path | None,
              transfer: bool, any_categories: bool = False):
    """Findings from --findings, the cache, or a fresh capture.

    With ``any_categories`` (prune-neurons), --category only selects: findings over every category
    serve it, so a category-restricted capture runs only when it is already cached.
    """
    from ..models import open_checkpoint
    from ..neuron_findings import cached_path, find_neurons, load_neuron_findings
    from ..pairs import load_pairs

    ckpt, _ = open_checkpoint(model, load)
    if findings_file is not None:
        pair_flags = kw["pairs_source"] != "builtin" or kw["language"] or kw["recompute"]
        if pair_flags:
            raise RecipeError("--findings already holds the scores; drop --pairs/--language/--recompute, "
                              "or drop --findings to compute new ones")
        found = load_neuron_findings(findings_file, ckpt, transfer)
        if found.transfer_note:
            err.print(f"[yellow]note:[/] {found.transfer_note}")
        return found
    if transfer:
        raise RecipeError("--transfer applies to --findings from another checkpoint; give --findings FILE")
    pairs = load_pairs(kw["pairs_source"], kw["language"], _categories(kw["categories"]))
    if any_categories and kw["categories"] and (kw["recompute"] or not cached_path(ckpt, pairs).is_file()):
        pairs = load_pairs(kw["pairs_source"], kw["language"])
    with progress_bars() as progress:  # stderr, with --json too
        return find_neurons(ckpt, pairs, batch_size=kw["batch_size"], strict=kw["strict"], load=load,
                            recompute=kw["recompute"], progress=progress,
                            report=lambda m: err.print(f"[yellow]note:[/] {m}"))


@cli.command(name="find-neurons")
@model_argument
@pair_options
@selection_options
@click.option("--n", "n", type=click.IntRange(min=1), default=40, show_default=True,
              help="How many top neurons to show (the findings keep every neuron's scores).")
@click.option("--out", "out_file", type=click.Path(path_type=Path), default=None,
              help="Also write the findings JSON here (they are always cached).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON (summary, not all scores).")
def find_neurons_cmd(model, load, n, out_file, as_json, score, rule, bias_weight,
                     layer_spec, spare_active, **kw):
    """Score every MLP neuron on contrastive demographic pairs; cache the findings."""
    from ..neuron_findings import summary, write_findings

    found = _findings(model, load, kw, None, False)
    if out_file is not None:
        write_findings(found.findings, out_file)
    cats = _categories(kw["categories"])
    shown = summary(found.scores, n, score, rule, bias_weight, cats, parse_layers(layer_spec), spare_active)
    if as_json:
        print_json({"findings": str(found.path), "cached": found.from_cache, "out": str(out_file) if out_file else None,
                    "dataset": dataset_brief(found.findings.get("dataset")), "summary": shown})
        return
    print_summary(shown, found.findings.get("dataset") or {})
    where = f"{found.path}" + (f" and {out_file}" if out_file else "")
    out.print(f"{'Cached' if found.from_cache else 'Saved'} findings: {where}")


@cli.command(name="prune-neurons")
@baking_command
@click.option("--neurons", default=None, help="Neurons as LAYER:INDEX pairs, e.g. 28:17,28:901 (or use --n).")
@click.option("--n", "n_spec", default=None,
              help="Prune the top N neurons from findings (computed once, cached); a list (20,40) bakes one "
                   "folder per value.")
@click.option("--findings", "findings_file", type=click.Path(path_type=Path), default=None,
              help="A neurons findings file (default: cached findings for MODEL, computed if missing).")
@click.option("--transfer", is_flag=True,
              help="Accept --findings from another checkpoint of the same architecture.")
@click.option("--factor", type=float, default=0.0, show_default=True,
              help="0 prunes (zeroes gate/up rows and the down column); other values scale the neuron "
                   "(0.5 damps, a negative value flips it, e.g. with --score signed).")
@selection_options
@pair_options
def prune_neurons(model, load, out_dir, force, verify, as_json, neurons, n_spec,
                  findings_file, transfer, factor, score, rule, bias_weight, layer_spec, spare_active, **kw):
    """Zero (or scale) MLP neurons — named, or the top N bias neurons — and write a new checkpoint."""
    if not math.isfinite(factor):
        raise RecipeError(f"--factor must be a finite number, got {factor}")
    if factor == 1.0:
        raise RecipeError("--factor 1 leaves every neuron unchanged; use 0 to prune or another value to scale")
    if (neurons is None) == (n_spec is None):
        raise RecipeError("give exactly one of --neurons LAYER:INDEX,… and --n N")
    bake_kw = dict(load=load, force=force, verify=verify, as_json=as_json)
    if neurons is not None:
        if findings_file or transfer:
            raise RecipeError("--neurons names the neurons itself; drop --findings/--transfer or use --n")
        run_bake(model, Recipe(tuple(parse_neurons(neurons, factor))), out_dir, **bake_kw)
        return
    values = parse_values(n_spec, "--n")
    if any(v != int(v) or v < 1 for v in values):
        raise RecipeError(f"--n must be whole numbers ≥ 1, got {n_spec}")
    found = _findings(model, load, kw, findings_file, transfer, any_categories=True)
    cats, layers = _categories(kw["categories"]), parse_layers(layer_spec)
    items = []
    for n in (int(v) for v in values):
        chosen = select(found.scores, n, score=score, rule=rule, categories=cats, layers=layers,
                        bias_weight=bias_weight, spare_active=spare_active)
        extra = selection_extra(found, chosen, factor)
        if not as_json:
            print_summary(extra["neuron_selection"], found.findings.get("dataset") or {}, title=f"n = {n}")
        recipe = Recipe(tuple(NeuronScale(layer, idx, factor) for layer, idx in chosen.neurons))
        items.append((sweep_label("n", n), recipe, extra))
    if len(items) == 1:
        run_bake(model, items[0][1], out_dir, extra=items[0][2], **bake_kw)
    else:
        run_sweep(model, items, out_dir, **bake_kw)
