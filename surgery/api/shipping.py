"""Shipping results from Python: LoRA export, evaluation, model cards, reports, the Hub, GGUF import."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.edits import Recipe
from ..core.errors import ParameterError, SurgeryError
from ..core.progress import Progress, StageProgress, silent, silent_stages
from ..evaluation.params import EvalParams
from ..model.loading import LoadSpec, open_checkpoint
from ._common import given_path, given_paths, no_other_options, reporter, typed
from .eval_data import EvalData
from .results import EvalResult, ExportedLora

if TYPE_CHECKING:
    from ..bake.record import Pushed
    from ..gguf.importing import ImportResult
    from ..ship.push_plan import PushPlan


def export_lora(
    model: str | Path,
    recipe: Recipe | str | Path,
    out: str | Path,
    *,
    vllm: bool = False,
    force: bool = False,
    allow_other_base: bool = False,
    load: LoadSpec | None = None,
    report: Callable[[str], None] | None = None,
    **options: Any,
) -> ExportedLora:
    """Write a PEFT LoRA adapter at ``out`` whose effect on ``model`` is exactly ``recipe`` (a Recipe,
    a recipe YAML, or a folder baked from ``model``: the recipe it recorded); ``vllm`` pads every
    module to one rank vLLM accepts. A recipe whose ``base_model`` names another model is refused, as
    ``apply`` refuses it, unless ``allow_other_base`` (the adapter then records both names; ``report``
    gets the note). Returns the folder and the adapter's record (``.adapter``: modules, ranks, recipe;
    ``to_dict()``: the JSON ``export-lora --json`` prints)."""
    from ..bake.lineage import for_source
    from ..bake.lora import export_lora as export
    from ..bake.lora import refuse_quantized
    from ..bake.lora_recipe import baked_folder, load_recipe

    load = typed(LoadSpec, options, load)
    no_other_options("export_lora", options, LoadSpec)
    ckpt, source = open_checkpoint(model, load)
    refuse_quantized(ckpt)  # before the recipe's checks: no recipe exports from quantized weights
    if not isinstance(recipe, Recipe):
        recipe = given_path(recipe, "recipe")
    # a baked folder's recipe is checked against the source it records instead (load_recipe)
    written = isinstance(recipe, Recipe) or baked_folder(recipe) is None
    recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe, ckpt)
    if written:  # a recipe of another model is refused as apply refuses it: its α and n were chosen there
        recipe, note = for_source(
            recipe, ckpt.config, source, allow_other_base=allow_other_base, verb=("export", "exported")
        )
        if note:
            reporter(report)(note)
    adapter = export(ckpt, recipe, out, vllm=vllm, force=force, source=source, report=reporter(report))
    return ExportedLora(str(out), adapter)


def evaluate(
    model: str | Path,
    *,
    against: str | Path | None = None,
    recompute: bool = False,
    out: str | Path | None = None,
    card: bool = False,
    data: EvalData | None = None,
    load: LoadSpec | None = None,
    params: EvalParams | None = None,
    progress: Progress = silent,
    report: Callable[[str], None] | None = None,
    **options: Any,
) -> EvalResult:
    """Evaluate ``model``: retention (perplexity, multiple choice), KL against ``against`` (the source;
    its results are cached), BBQ bias (``bbq`` files), DiffAware / CtxtAware (``n4``) and lm-eval
    tasks, the share of greedy answers to ``prompts`` holding one of ``markers`` (files; one marker
    a line): ``data``, or its fields, :class:`~surgery.api.eval_data.EvalData`. ``out`` writes the
    result JSON; ``card`` puts the before/after table into ``model``'s card (a local baked folder).
    Options: ``LoadSpec`` and ``EvalParams`` fields (``suites``, ``limit``, ``batch_size``,
    ``max_new_tokens``). Returns the result (``to_dict()``: its JSON, as
    ``out`` gets it)."""
    from ..core.distributed import is_main
    from ..core.evaluation_result import save_result
    from ..evaluation.suites import evaluate as run
    from ..evaluation.suites import make_plan

    data = typed(EvalData, options, data)
    load, params = typed(LoadSpec, options, load), typed(EvalParams, options, params)
    no_other_options("evaluate", options, EvalData, LoadSpec, EvalParams)
    if out:  # a folder or an unwritable one is refused now, not after the evaluation
        from ..core.destinations import check_out_file

        out = given_path(out, "out")  # ~ expanded: written where it was checked, not under ./~
        check_out_file(out, "eval.json")
    plan = make_plan(
        params.suites,
        against=against is not None,
        limit=params.limit,
        bbq=[given_path(b, "bbq") for b in data.bbq],
        n4=given_path(data.n4, "n4") if data.n4 else None,
        lm_eval_tasks=list(data.lm_eval),
        lm_eval_include=given_path(data.lm_eval_include, "lm_eval_include") if data.lm_eval_include else None,
        batch_size=params.batch_size,
        prompts=given_path(data.prompts, "prompts") if data.prompts else None,
        markers=given_path(data.markers, "markers") if data.markers else None,
        max_new_tokens=params.max_new_tokens,
    )
    # Opened as checkpoints: the same safety checks (remote code, pickles) as every other command.
    _, source = open_checkpoint(model, load)
    against_path = open_checkpoint(against, replace(load, revision=None), name="against")[1].path if against else None
    if card:
        from ..ship.card import check_card_evaluation

        if source.hub_id:
            raise ParameterError(
                "{card} rewrites a local baked folder; MODEL is a Hub download (the Hub cache is "
                "never written): give the local folder, or write the card later",
                "card",
            )
        check_card_evaluation(source.path, against_path)  # fail now, not after the evaluation
    result = run(
        source.path,
        plan,
        against=against_path,
        load=load,
        recompute=recompute,
        progress=progress,
        report=reporter(report),
    )
    if is_main():  # under torchrun rank 0 alone writes
        if out:
            save_result(result, Path(out))
        if card:
            from ..ship.card import card_with_evaluation

            card_with_evaluation(source.path, result, str(out) if out else "this evaluation")
    return EvalResult.of(result)


def write_card(folder: str | Path, evaluation: str | Path | None = None) -> Path:
    """Rewrite the model card of a baked ``folder`` (keeping surgery.json's hashes consistent), with
    the before/after table of ``evaluation`` (an eval JSON of this very folder) when given."""
    from ..core.evaluation_result import load_result
    from ..ship.card import card_with_evaluation, refresh_card

    folder = given_path(folder, "folder")
    if evaluation is None:
        return refresh_card(folder)
    evaluation = given_path(evaluation, "evaluation")
    return card_with_evaluation(folder, load_result(evaluation), str(evaluation))


def push(
    folder: str | Path,
    repo: str,
    *,
    private: bool = False,
    revision: str | None = None,
    create_pr: bool = False,
    message: str | None = None,
    dry_run: bool = False,
) -> Pushed | PushPlan:
    """Push a verified baked folder (or exported adapter) to the Hub repo ``repo`` (token from
    ``HF_TOKEN`` or ``hf auth login``, never printed); ``revision``: the branch, created when missing.
    ``folder`` may be a baked .gguf file: it goes with its two sidecars and a model card written from
    its record, in one commit. ``dry_run``: make every check and return the :class:`PushPlan` (the
    files and their sizes) without any request to the Hub."""
    from ..ship.hub import push as upload
    from ..ship.push_plan import plan_push

    folder = given_path(folder, "folder")
    run = plan_push if dry_run else upload
    return run(folder, repo, private=private, revision=revision, create_pr=create_pr, message=message)


REPORT_FILE_SUFFIXES = (".md", ".markdown", ".html", ".pdf", ".txt")  # what a user expects a report file to be


def report(
    findings: Iterable[str | Path], out: str | Path, *, evals: Iterable[str | Path] = (), force: bool = False
) -> Path:
    """Write a markdown report with figures from findings files and eval results (needs matplotlib)
    into the folder ``out``; returns the report's path."""
    from ..ship.report import build_report

    findings, evals = given_paths(findings, "findings"), given_paths(evals, "evals")
    if not findings and not evals:
        raise SurgeryError("give at least one findings file or eval result to report on")
    out = given_path(out, "out")
    if out.suffix.lower() in REPORT_FILE_SUFFIXES:  # `--out report.md` would become a folder of that name
        raise ParameterError(
            f"{{out}} {out} names a file, and report writes a folder (report.md and its figures): give a "
            f"folder, e.g. {out.with_suffix('')}",
            "out",
        )
    return build_report(findings, evals, out, force=force)


def import_gguf(
    gguf_file: str | Path,
    out: str | Path,
    *,
    dtype: str = "float32",
    force: bool = False,
    stages: StageProgress = silent_stages,
    report: Callable[[str], None] | None = None,
) -> ImportResult:
    """Dequantize a GGUF file into a safetensors checkpoint (config, weights, tokenizer) at ``out``."""
    from ..gguf.importing import import_gguf as convert

    return convert(
        given_path(gguf_file, "gguf_file"), out, dtype=dtype, force=force, report=reporter(report), progress=stages
    )
