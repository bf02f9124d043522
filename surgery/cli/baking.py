"""What every baking command shares: the bake run (with its model card and push), and sweeps that
bake one output per α or n."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..bake.bake import bake
from ..bake.check import edited_check
from ..bake.guards import check_scales
from ..bake.lineage import for_source
from ..bake.record import BakeRecord, Evaluation
from ..core.edits import Recipe
from ..core.errors import RecipeError
from ..core.staging import check_container, check_free
from ..model.loading import DEFAULT_LOAD, LoadSpec, open_checkpoint
from ..ship.card import card_hook
from .console import note, out, print_json, stage_progress
from .options import PRIVATE_KEY, PUSH_KEY, context_value


@dataclass
class Baked:
    """One finished bake: where it went, its provenance, and the notes reported on the way."""

    out: Path
    provenance: BakeRecord
    notes: list[str]
    extra: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        """The --json object of this bake."""
        record = self.provenance
        return {"out": str(self.out), "edits": len(record.recipe.edits),
                "tensors_edited": len(record.edited_pairs()),
                "verification": record.verification.to_dict() if record.verification else None,
                "notes": self.notes, "pushed": record.pushed.to_dict() if record.pushed else None,
                **(self.extra or {})}  # the selection / findings summary that went into surgery.json

    def print_line(self) -> None:
        """The human summary: what was baked where (and pushed where)."""
        record, ver, pushed = self.provenance, self.provenance.verification, self.provenance.pushed
        check = ("" if not ver else
                 f", {ver.maps} edited map(s) match the run-time edit (max |Δ| {ver.max_abs_diff:.2e})")
        out.print(f"[green]Baked[/] {len(record.recipe.edits)} edit(s) into {len(record.edited_pairs())} "
                  f"tensor(s){check} → {self.out}")
        if pushed:
            out.print(f"[green]Pushed[/] to {pushed.repo} ({pushed.revision}): {pushed.commit_url}")




def bake_one(model: str, recipe: Recipe, out_dir: Path, *, load: LoadSpec = DEFAULT_LOAD,
             force: bool = False, verify: bool = True, extra: dict[str, Any] | None = None,
             evaluation: Evaluation | None = None, push_to: str | None = None,
             push_revision: str | None = None, private: bool | None = None,
             allow_other_base: bool = False, allow_zero: bool = False) -> Baked:
    """Open MODEL, bake ``recipe`` into ``out_dir`` (and push it); print nothing but progress and notes.

    The output gets a model card (README.md) built from the provenance, ``extra`` (findings
    summary) and ``evaluation`` (rows of a before/after table, see surgery.ship.card). ``push_to``
    (default: the command's --push-to) uploads the result, to branch ``push_revision`` if given.
    A recipe written for another model is refused unless ``allow_other_base`` (surgery.bake.lineage);
    ``allow_zero`` accepts a scale that rounds a head's or neuron's weights to zero (surgery.bake.guards).
    """
    push_to = push_to or context_value(PUSH_KEY)
    private = bool(context_value(PRIVATE_KEY)) if private is None else private
    if push_to:
        from ..ship.hub import preflight

        preflight(push_to, push_revision)  # fail before a long bake, not after it
    ckpt, source = open_checkpoint(model, load)
    recipe, lineage = for_source(recipe, ckpt.config, source, allow_other_base=allow_other_base)
    notes = [lineage] if lineage else []
    if lineage:
        note(lineage)
    with stage_progress() as progress:  # stderr: shown with --json too, which owns stdout only
        result = bake(ckpt, recipe, out_dir, source=source, force=force, progress=progress,
                      check=edited_check(ckpt, recipe) if verify else None, extra=extra,
                      card=card_hook(evaluation), report=note, allow_zero=allow_zero)
    record = result.provenance
    if push_to:
        from ..ship.hub import push

        record = replace(record, pushed=push(out_dir, push_to, private=private, revision=push_revision))
    return Baked(Path(out_dir), record, notes + result.notes, extra)


def run_bake(model: str, recipe: Recipe, out_dir: Path, *, as_json: bool = False,
             **kwargs: Any) -> BakeRecord:
    """:func:`bake_one`, then its summary (one JSON object with ``as_json``); returns the bake's record."""
    baked = bake_one(model, recipe, out_dir, **kwargs)
    if as_json:
        print_json(baked.summary())
    else:
        baked.print_line()
    return baked.provenance


def parse_values(spec: str, option: str) -> list[float]:
    """``"1.5,2,2.5"`` → [1.5, 2.0, 2.5] for sweep options (``option`` names the flag in errors)."""
    values = []
    for part in filter(None, (p.strip() for p in str(spec).split(","))):
        try:
            values.append(float(part))
        except ValueError:
            raise RecipeError(f"{option}: '{part}' is not a number (give one value or a list like 1.5,2,2.5)") from None
    if not values:
        raise RecipeError(f"{option} is empty; give one value or a comma-separated list")
    if len(set(values)) != len(values):
        raise RecipeError(f"{option} lists a value twice; give each value once")
    return values


def sweep_label(name: str, value: float) -> str:
    """A folder and branch name for one sweep value, e.g. ``alpha-2.5`` or ``n-40``."""
    return f"{name}-{value:g}"


def run_sweep(model: str, items: list[tuple[str, Recipe, dict[str, Any] | None]], out_dir: Path, *,
              push_to: str | None = None, as_json: bool = False, **bake_kwargs: Any) -> dict[str, BakeRecord]:
    """Bake one output per ``(label, recipe, extra)`` into ``out_dir/<label>``.

    Every destination and every value's scales (surgery.bake.guards) are checked before the first
    bake, so a taken destination or a refused value fails the sweep with nothing written. With
    ``push_to`` (default: the command's --push-to), each output is pushed to the branch ``<label>``
    of that repo. ``bake_kwargs`` go to :func:`bake_one` (load, force,
    verify, …). With ``as_json`` one JSON list is printed at the end, one object per
    value with its ``label``. Returns the record of each output by label.
    """
    labels = [label for label, _, _ in items]
    if len(set(labels)) != len(labels):
        raise RecipeError("sweep labels must be unique (each value gets its own folder and branch)")
    push_to = push_to or context_value(PUSH_KEY)
    out_dir = Path(out_dir)
    ckpt, source = open_checkpoint(model, bake_kwargs.get("load", DEFAULT_LOAD))
    # Every value's scales before the first bake: a refused one leaves no outputs.
    check_scales(ckpt, [recipe for _, recipe, _ in items], allow_zero=bool(bake_kwargs.get("allow_zero")))
    check_container(out_dir, [source.path])  # the sweep's folder may exist: it holds the values
    for label in labels:
        check_free(out_dir / label, [source.path], bool(bake_kwargs.get("force")))
    out_dir.mkdir(parents=True, exist_ok=True)
    results, summaries = {}, []
    for label, recipe, extra in items:
        baked = bake_one(model, recipe, out_dir / label, extra=extra, push_to=push_to,
                         push_revision=label if push_to else None, **bake_kwargs)
        results[label] = baked.provenance
        summaries.append({"label": label, **baked.summary()})
        if not as_json:
            baked.print_line()
    if as_json:
        print_json(summaries)  # one document for the whole sweep, not one object per value
    return results


def bake_each(model: str, items: list[tuple[str | None, Recipe, dict[str, Any] | None]], out_dir: Path,
              **bake_kwargs: Any) -> BakeRecord | dict[str, BakeRecord]:
    """The one ending of amplify-heads and prune-neurons: one ``(label, recipe, extra)`` bakes into
    ``out_dir``; several (a sweep over α or n) bake into ``out_dir/<label>`` each."""
    if len(items) == 1:
        _, recipe, extra = items[0]
        return run_bake(model, recipe, out_dir, extra=extra, **bake_kwargs)
    return run_sweep(model, items, out_dir, **bake_kwargs)
