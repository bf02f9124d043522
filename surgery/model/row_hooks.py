"""Several projection edits at run time in one batch: each edit acts on its own rows.

A tune evaluates several trials in one forward (find.tune.trial_batch): their prompts stacked, trial by
trial, and each trial's direction edit applied to its rows alone. Each hook is model.hooks' projection
twin (y ← y − w·r(rᵀy), the same function) run on the rows of one edit at a time, so a row gets the
numbers it gets with its edit alone hooked in; rows of an edit that does not touch the module pass
through unchanged. Which edit a row belongs to is :class:`RowEdits`'s ``rows``, which the caller keeps
up to date as rows leave the batch (evaluation.greedy's ``keep``).

Only projection sites outside routed experts are twinned here (a direction edit's); for anything else
:func:`rows_editable` says no and the caller evaluates the edits one at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from ..core.edits import Edit
from ..core.sites import all_sites
from .hooks import _module, _project, model_architecture, projections


class RowEdits:
    """Which edit (an index into the edit sets) each row of the batch now running belongs to."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows
        self._groups: list[tuple[int, torch.Tensor]] | None = None

    def keep(self, index: torch.Tensor) -> None:
        """The batch now holds only the rows ``index`` (positions in the current batch), in that order."""
        self.rows = self.rows[index.to(self.rows.device)]
        self._groups = None

    def groups(self) -> list[tuple[int, torch.Tensor]]:
        """(edit, the positions of its rows) of every edit with a row in the batch; made once per batch
        state, not at every hooked module."""
        if self._groups is None:
            self._groups = [(int(e), (self.rows == e).nonzero().flatten()) for e in self.rows.unique()]
        return self._groups


def rows_editable(model: nn.Module, edit_sets: Sequence[Sequence[Edit]]) -> bool:
    """Whether :func:`applied_rows` twins every site of ``edit_sets``: projections outside routed
    experts, and no run-time scale or addition."""
    arch = model_architecture(model)
    for edits in edit_sets:
        for site in all_sites(arch, edits):
            if site.op == "scale" and not site.twin:
                continue  # bake-only completeness: no run-time effect
            if site.op != "project" or site.expert is not None:
                return False
    return True


def _project_rows(per_edit: dict[int, tuple[torch.Tensor, float]], rows: RowEdits, out: bool):
    """A forward hook (``out``) or pre-hook projecting each edit's rows of the module's output (input)."""

    def edit(y: torch.Tensor) -> torch.Tensor:
        done = None
        for e, where in rows.groups():
            if e in per_edit:
                r, w = per_edit[e]
                done = y.clone() if done is None else done
                done[where] = _project(y[where], r, w)
        return y if done is None else done

    def pre_hook(module: nn.Module, args: tuple):
        return (edit(args[0]),) + tuple(args[1:])

    def hook(module: nn.Module, args: tuple, output):
        if isinstance(output, tuple):
            return (edit(output[0]),) + output[1:]
        return edit(output)

    return hook if out else pre_hook


@contextmanager
def applied_rows(model: nn.Module, edit_sets: Sequence[Sequence[Edit]], rows: RowEdits) -> Iterator[RowEdits]:
    """Apply ``edit_sets[e]`` to the rows ``rows`` gives edit ``e``, at run time; the hooks are removed
    on exit, even on error (:func:`rows_editable` must hold)."""
    arch = model_architecture(model)
    sites: dict[tuple[str, int | None], dict[int, tuple[torch.Tensor, float]]] = {}
    for e, edits in enumerate(edit_sets):
        for key, rw in projections(arch, edits).items():
            sites.setdefault(key, {})[e] = rw
    handles = []
    try:
        head = model.get_output_embeddings()
        for (module, layer), per_edit in sites.items():
            target = _module(model, arch, layer, module)
            handles.append(target.register_forward_hook(_project_rows(per_edit, rows, True)))
            if layer is None and head is not None and head.weight is getattr(target, "weight", None):
                # tied: the same table (model.hooks.applied)
                handles.append(head.register_forward_pre_hook(_project_rows(per_edit, rows, False)))
        yield rows
    finally:
        for h in handles:
            h.remove()
