"""What every baking command shows: the bake line (or its JSON), one line per value of a sweep,
and the sweep values parsed from the command line. The bake itself is the library's
(surgery.api.baking)."""

from __future__ import annotations

from ..api.bake_options import BakeOptions
from ..api.baking import Baked
from ..core.comma_list import comma_items
from ..core.counted import counted
from ..core.errors import ParameterError
from .console import note, out, print_json
from .options import PRIVATE_KEY, PUSH_KEY, REQUANTIZE_KEY, context_value


def bake_settings(
    force: bool, verify: bool, *, allow_zero: bool = False, allow_other_base: bool = False
) -> BakeOptions:
    """The command's bake flags as the library's :class:`BakeOptions`: those it was called with, and
    --push-to, --private and --requantize, remembered in the click context."""
    return BakeOptions(
        force=force,
        verify=verify,
        allow_zero=allow_zero,
        allow_other_base=allow_other_base,
        requantize=bool(context_value(REQUANTIZE_KEY)),
        push_to=context_value(PUSH_KEY),
        private=bool(context_value(PRIVATE_KEY)),
    )


def print_baked(baked: Baked) -> None:
    """The human summary: what was baked where (and pushed where)."""
    record, ver, pushed = baked.provenance, baked.provenance.verification, baked.provenance.pushed
    edits = counted(len(record.recipe.edits), "edit")
    check = ""
    if ver:
        matched = f"{counted(ver.maps, 'edited map')} {'matches' if ver.maps == 1 else 'match'}"
        check = f", {matched} the run-time edit (max |Δ| {ver.max_abs_diff:.2e})"
    out.print(f"[green]Baked[/] {edits} into {counted(baked.tensors_edited, 'tensor')}{check} → {baked.out}")
    idle = [e for e in record.recipe.edits if e.is_identity()]
    if idle:  # "Baked 1 edit into 0 tensors" alone does not say why nothing changed
        named = ", ".join(f"{e.kind} {e.label} ({e.setting})" for e in idle)
        change = "changes" if len(idle) == 1 else "change"
        note(
            f"{len(idle)} of the {edits} {change} nothing (α or factor 1, weight 0): "
            f"{named}; {baked.out} holds the source's weights there"
        )
    if pushed:
        out.print(f"[green]Pushed[/] to {pushed.repo} ({pushed.revision}): {pushed.commit_url}")


def each_line(as_json: bool):
    """The ``on_each`` of a bake: a line per output as it is written (none with --json: one document
    is printed at the end, :func:`print_result`)."""
    return None if as_json else (lambda label, baked: print_baked(baked))


def print_result(result: Baked | dict[str, Baked], as_json: bool) -> None:
    """With --json: one object for a bake, one list for a sweep (each value with its ``label``)."""
    if not as_json:
        return
    if isinstance(result, Baked):
        print_json(result.summary())
    else:
        print_json([{"label": label, **baked.summary()} for label, baked in result.items()])


def parse_values(spec: str, option: str, example: str = "1.5,2,2.5") -> list[float]:
    """``"1.5,2,2.5"`` → [1.5, 2.0, 2.5] for sweep options (``option`` names the flag in errors,
    ``example`` is the list the error shows: whole numbers for counts such as --n)."""
    values = []
    for part in comma_items(spec, option, example):
        try:
            values.append(float(part))
        except ValueError:
            raise ParameterError(
                f"{{{option}}}: '{part}' is not a number (give one value or a list like {example})", option
            ) from None
    if not values:
        raise ParameterError(f"{{{option}}} is empty; give one value or a comma-separated list", option)
    return values
