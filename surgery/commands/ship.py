"""Commands that ship results: eval, card, export-lora, push, report."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..cli import cli
from ..console import out, print_json
from ..edits import Recipe
from ..errors import SurgeryError
from ..models import open_checkpoint
from .common import model_argument


@cli.command(name="export-lora")
@model_argument
@click.option("--recipe", "recipe_path", required=True, type=click.Path(path_type=Path),
              help="Recipe YAML whose edits the adapter reproduces.")
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path),
              help="Adapter folder to write (atomically).")
@click.option("--vllm", is_flag=True, help="Pad every module to one rank vLLM accepts (8 … 512).")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def export_lora_cmd(model, revision, trust_remote_code, recipe_path, out_dir, vllm, force, as_json):
    """Write a PEFT LoRA adapter whose effect on MODEL is exactly the recipe."""
    from ..export import export_lora

    ckpt, source = open_checkpoint(model, revision, trust_remote_code)
    summary = export_lora(ckpt, Recipe.load(recipe_path), out_dir, vllm=vllm, force=force, source=source)
    if as_json:
        print_json({"out": str(out_dir), **summary})
        return
    ranks = sorted(set(summary["modules"].values()))
    out.print(f"[green]Exported[/] {len(summary['modules'])} LoRA module(s), rank "
              f"{'/'.join(map(str, ranks))}{' (vLLM)' if vllm else ''}, lora_alpha = r → {out_dir}")


@cli.command(name="push")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--repo", "repo_id", required=True, metavar="NAMESPACE/NAME", help="Hub repo to push to.")
@click.option("--private", is_flag=True, help="Create the repo as private (an existing repo keeps its visibility).")
@click.option("--revision", default=None, help="Branch to push to (created when missing).")
@click.option("--create-pr", is_flag=True, help="Open a pull request against main instead of committing.")
@click.option("--message", default=None, help="Commit message.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def push_cmd(folder, repo_id, private, revision, create_pr, message, as_json):
    """Push a verified checkpoint (or exported adapter) FOLDER to the Hub.

    The token comes from HF_TOKEN or `hf auth login`; it is never printed.
    """
    from ..hub import push

    result = push(folder, repo_id, private=private, revision=revision, create_pr=create_pr, message=message)
    if as_json:
        print_json(result)
        return
    out.print(f"Checked: {result['checked']}")
    where = result["pr_url"] or result["commit_url"]
    out.print(f"[green]Pushed[/] {folder} to {result['repo']} ({result['revision']}): {where}")


@cli.command(name="card")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--eval", "eval_path", type=click.Path(path_type=Path), default=None,
              help="An eval JSON (surgery eval --out) whose before/after table goes into the card.")
def card_cmd(folder, eval_path):
    """Rewrite the model card of a baked FOLDER (keeps surgery.json's hashes consistent)."""
    from ..card import refresh_card
    from ..evaluate_io import card_summary, load_result

    evaluation = card_summary(load_result(eval_path)) if eval_path else None
    path = refresh_card(folder, evaluation)
    out.print(f"[green]Wrote[/] {path}{' with the evaluation table' if evaluation else ''}")


def load_json(path: Path, what: str) -> dict:
    """A JSON file given on the command line, with a one-line error."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SurgeryError(f"cannot read {what} {path} ({type(exc).__name__}); give the file that "
                           "surgery wrote") from None
