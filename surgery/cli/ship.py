"""Commands that ship results: eval, card, export-lora, push, report."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from .. import api
from ..api.params import EvalParams
from ..api.results import EvalResult
from ..core.comma_list import comma_items
from ..core.counted import counted
from ..core.distributed import is_main
from .console import err, note, out, print_json, print_table, progress_bars
from .group import cli
from .options import model_argument, typed_options


@cli.command(name="export-lora")
@model_argument(runs_model=False)
@click.option(
    "--recipe",
    "recipe_path",
    required=True,
    type=click.Path(path_type=Path),
    help="Recipe YAML whose edits the adapter reproduces, or a folder baked from MODEL "
    "(or its surgery.json): the recipe it recorded.",
)
@click.option(
    "--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Adapter folder to write (atomically)."
)
@click.option("--vllm", is_flag=True, help="Pad every module to one rank vLLM accepts (8 … 512).")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@click.option(
    "--allow-other-base",
    is_flag=True,
    help="Export a recipe whose base_model names another model "
    "(refused otherwise: its α and n were chosen there); the adapter records both names.",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def export_lora_cmd(model, load, recipe_path, out_dir, vllm, force, allow_other_base, as_json):
    """Write a PEFT LoRA adapter whose effect on MODEL is exactly the recipe."""
    exported = api.export_lora(
        model, recipe_path, out_dir, vllm=vllm, force=force, allow_other_base=allow_other_base, load=load, report=note
    )
    if as_json:
        print_json(exported.to_dict())
        return
    modules = exported.adapter.modules
    ranks = sorted(set(modules.values()))
    out.print(
        f"[green]Exported[/] {counted(len(modules), 'LoRA module')}, rank "
        f"{'/'.join(map(str, ranks))}{' (vLLM)' if vllm else ''}, lora_alpha = r → {out_dir}"
    )


@cli.command(name="push")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--repo", "repo_id", required=True, metavar="NAMESPACE/NAME", help="Hub repo to push to.")
@click.option("--private", is_flag=True, help="Create the repo as private (an existing repo keeps its visibility).")
@click.option("--revision", default=None, help="Branch to push to (created when missing).")
@click.option("--create-pr", is_flag=True, help="Open a pull request against main instead of committing.")
@click.option("--message", default=None, help="Commit message.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Make every check and print what would be uploaded (files and sizes), with no request to the Hub.",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def push_cmd(folder, repo_id, private, revision, create_pr, message, dry_run, as_json):
    """Push a verified checkpoint (or exported adapter) FOLDER to the Hub.

    FOLDER may be a baked .gguf file: it goes with its two .surgery sidecars and a model card
    written from its record, in one commit.

    The token comes from HF_TOKEN or `hf auth login`; it is never printed.
    """
    pushed = api.push(
        folder, repo_id, private=private, revision=revision, create_pr=create_pr, message=message, dry_run=dry_run
    )
    if as_json:
        print_json(pushed.to_dict())
        return
    if dry_run:
        print_push_plan(folder, pushed)
        return
    out.print(f"Checked: {pushed.checked}")
    if pushed.pr_url:  # nothing reached main: say so, and where the pull request is
        out.print(f"[green]Opened a pull request[/] with {folder} against {pushed.repo} (main): {pushed.pr_url}")
        return
    out.print(f"[green]Pushed[/] {folder} to {pushed.repo} ({pushed.revision}): {pushed.commit_url}")


def print_push_plan(folder: Path, plan: Any) -> None:
    """What ``push --dry-run`` checked and would upload."""
    from ..core.sizes import human_size

    out.print(f"Checked: {plan.checked}")
    out.print(f"Model card: {plan.card or 'none (the repo gets no README.md)'}")
    table = Table(title=f"Would upload (dry run, nothing sent): {folder}")
    table.add_column("file", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True)
    for f in plan.files:
        table.add_row(f.name, human_size(f.size))
    print_table(table)
    where = "a pull request against main" if plan.create_pr else f"branch {plan.revision}"
    visibility = "private" if plan.private else "public"
    out.print(
        f"Would push {counted(len(plan.files), 'file')} ({human_size(plan.size)}) to {plan.repo}, {where}, "
        f"in one commit ({plan.message!r}); a new repo would be {visibility}, an existing one keeps its visibility"
    )


@cli.command(name="card")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option(
    "--eval",
    "eval_path",
    type=click.Path(path_type=Path),
    default=None,
    help="An eval JSON (surgery eval --out) whose before/after table goes into the card.",
)
def card_cmd(folder, eval_path):
    """Rewrite the model card of a baked FOLDER (keeps surgery.json's hashes consistent)."""
    path = api.write_card(folder, eval_path)
    out.print(f"[green]Wrote[/] {path}{' with the evaluation table' if eval_path else ''}")


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


ARROWS = {"higher": "↑", "lower": "↓", "zero": "(0 = none)"}
# What each count of settings.items is, as the table's caption says it.
ITEM_NAMES = {
    "passages": "passages",
    "mcq": "MCQ questions",
    "prompts": "neutral prompts",
    "bbq": "BBQ items",
    "n4": "N4 items",
    "marker_prompts": "marker prompts",
}


def items_measured(settings: dict[str, Any]) -> str:
    """``measured on 5 passages, 5 MCQ questions``: how many items the numbers rest on (with --limit
    a handful, which the table would otherwise not show)."""
    counts = settings.get("items") or {}
    parts = [f"{counts[key]} {name}" for key, name in ITEM_NAMES.items() if counts.get(key)]
    return f"measured on {', '.join(parts)}; " if parts else ""


def eval_table(result: EvalResult) -> Table:
    """The metrics as a rich table: source, model, and retained % (or Δ for non-retention metrics)."""
    from ..api.records import metric_info

    model, against = result.metrics.model, result.metrics.against or {}
    table = Table(
        title=f"surgery eval: {result.model.path}",
        caption=f"{items_measured(result.settings)}↑ higher is better, ↓ lower is better",
    )
    table.add_column("metric")
    if result.against:
        table.add_column("source", justify="right")
    table.add_column("model", justify="right")
    if result.against:
        table.add_column("retained / Δ", justify="right")
    for key, value in model.items():
        label, better, _ = metric_info(key)
        row = [f"{label} {ARROWS[better]}"]
        if result.against:
            row.append(_cell(against.get(key)))
        row.append(_cell(value))
        if result.against:
            pct = result.retained_pct.get(key)
            before = against.get(key)
            delta = (value - before) if isinstance(value, float) and isinstance(before, float) else None
            row.append(
                f"{pct:.1f}%"
                if pct is not None
                else (f"{delta:+.4g}" if delta is not None and math.isfinite(delta) else "")
            )
        table.add_row(*row)
    return table


@cli.command(name="eval")
@model_argument(revision="Hub revision (branch, tag or commit) of MODEL; --against is read at its default revision.")
@click.option(
    "--against",
    default=None,
    help="Source checkpoint to compare with (KL, % retained, before/after); "
    "its results are cached, so a second eval against it measures MODEL only.",
)
@click.option(
    "--recompute",
    is_flag=True,
    help="Evaluate the --against source again instead of taking its cached results (the cache is then rewritten).",
)
@typed_options(EvalParams, into="params")
@click.option(
    "--bbq",
    "bbq_paths",
    multiple=True,
    type=click.Path(path_type=Path),
    help="BBQ-format JSONL file or folder (repeatable).",
)
@click.option("--n4", "n4_path", type=click.Path(path_type=Path), default=None, help="N4-format JSONL file.")
@click.option("--lm-eval", "lm_eval_tasks", default="", help="Comma-separated lm-eval task names (needs lm-eval).")
@click.option(
    "--lm-eval-include", type=click.Path(path_type=Path), default=None, help="Folder of extra lm-eval task YAML files."
)
@click.option(
    "--prompts",
    "prompts_path",
    type=click.Path(path_type=Path),
    default=None,
    help='Prompts for the markers suite: text (one a line) or JSONL ({"prompt": …} a line).',
)
@click.option(
    "--markers",
    "markers_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Markers for the markers suite, one a line: an answer that contains one counts (case-insensitive).",
)
@click.option(
    "--out", "out_path", type=click.Path(path_type=Path), default=None, help="Write the result JSON here (atomically)."
)
@click.option(
    "--card",
    "update_card",
    is_flag=True,
    help="Put the before/after table into MODEL's model card "
    "(MODEL must be a surgery checkpoint; surgery.json is kept consistent).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result JSON instead of the table.")
def eval_cmd(
    model,
    load,
    against,
    recompute,
    params,
    bbq_paths,
    n4_path,
    lm_eval_tasks,
    lm_eval_include,
    prompts_path,
    markers_path,
    out_path,
    update_card,
    as_json,
):
    """Evaluate MODEL: retention, KL vs --against, BBQ bias, DiffAware/CtxtAware, markers, lm-eval tasks."""
    # Progress and notes go to stderr, with --json too (it owns stdout only).
    with progress_bars() as progress:
        result = api.evaluate(
            model,
            against=against,
            recompute=recompute,
            data=api.EvalData(
                bbq=bbq_paths,
                n4=n4_path,
                lm_eval=comma_items(lm_eval_tasks, "lm_eval", "hellaswag,arc_easy"),
                lm_eval_include=lm_eval_include,
                prompts=prompts_path,
                markers=markers_path,
            ),
            out=out_path,
            card=update_card,
            load=load,
            params=params,
            progress=progress,
            report=lambda m: err.print(f"[dim]{m}[/]"),
        )
    if not is_main():
        return  # under torchrun rank 0 alone prints
    if as_json:
        from ..api.records import clean

        print_json(clean(result.to_dict()))
        return
    print_table(eval_table(result))
    cached = result.against is not None and result.against.from_cache
    out.print(
        f"{result.seconds:.0f} s"
        + ("; the source's results from the cache" if cached else "")
        + (f"; result → {out_path}" if out_path else "")
        + ("; model card updated" if update_card else "")
    )


@cli.command(name="report")
@click.argument("findings", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--eval",
    "evals",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Eval result JSON (surgery eval --out); repeatable.",
)
@click.option(
    "--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Report folder (written atomically)."
)
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def report_cmd(findings, evals, out_dir, force):
    """Write a markdown report with figures from FINDINGS files (and tune records) and eval results
    (needs matplotlib)."""
    path = api.report(findings, out_dir, evals=evals, force=force)
    pngs = sorted(p.name for p in path.parent.glob("*.png"))
    out.print(f"[green]Wrote[/] {path} with {counted(len(pngs), 'figure')}")
