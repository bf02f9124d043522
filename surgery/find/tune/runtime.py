"""Edits measured at run time from recorded baseline passes: the trials of every tune method.

Each batch of prompts runs once without an edit (find-heads' resume.snapshot records every decoder
layer's inputs); a trial then reruns only the layers from its lowest edited one on
(resume.resume_scaled: the full pass's computation bit for bit, from that layer), with the edit
hooked in at run time (model.hooks.applied). No trial bakes a checkpoint. A split keeps at most
``--keep-memory`` of recordings (default find-heads' 2 GiB, :class:`Keep`): batches past it keep only
their inputs and run every layer under each trial's edit, so a large tune is slower, never out of memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...core import distributed
from ...core.edit_kind import Edit
from ...core.freed_memory import trim_heap
from ...core.mcq import Encoded
from ...core.progress import Advance
from ...core.sizes import human_size
from ...model.placement import input_device
from ..heads.causal import KEEP_BYTES
from ..heads.prompts import batch_groups, collate
from ..heads.resume import Snapshot, resume_scaled, snapshot
from ..heads.scores import SPAN_NAMES, pad_id


@dataclass
class Recorded:
    """One prompt set's baseline passes (this rank's batches): the snapshot of each batch and the
    rows it holds, of ``n`` prompts in all."""

    batches: list[tuple[list[int], Snapshot]]
    n: int

    @property
    def mine(self) -> list[int]:
        """The prompts this rank holds, in the order :func:`last_logprobs` returns their rows."""
        return [i for idx, _ in self.batches for i in idx]


@dataclass
class Keep:
    """The recordings one split may still hold, shared by its prompt sets: a batch that does not fit
    keeps only its inputs and baseline logits (Snapshot.without_layers) and runs in full per trial."""

    bound: int = KEEP_BYTES  # --keep-memory
    in_full: int = 0  # prompts whose batches run every layer in each trial
    left: int = field(init=False)  # of the bound, what the batches kept so far leave

    def __post_init__(self) -> None:
        self.left = self.bound

    def __call__(self, snap: Snapshot, rows: int) -> Snapshot:
        size = snap.nbytes()
        if size <= self.left:
            self.left -= size
            return snap
        self.in_full += rows
        return snap.without_layers()


def held_note(
    prompts: Sequence[Encoded], geometry: Mapping[str, Any], itemsize: int, what: str, fewer: str, bound: int
) -> str:
    """What recording ``prompts`` takes (each token's input to every decoder layer and its keys and
    values, padding left out: a lower bound) and whether it fits :class:`Keep`'s ``bound``, said before
    the passes: a search past it runs slower, and the user learns why (and which option) before waiting."""
    per_token = geometry["num_layers"] * (geometry["hidden_size"] + 2 * geometry["num_kv_heads"] * geometry["head_dim"])
    tokens = sum(len(p.ids) for p in prompts)
    size = tokens * per_token * itemsize
    held = (
        f"{len(prompts):,} prompts' decoder-layer inputs, keys and values: about {human_size(size)} ({tokens:,} tokens)"
    )
    if size <= bound:
        return f"the {what}'s baseline passes keep {held} in memory while it is measured (--keep-memory)"
    return (
        f"the {what}'s baseline passes would keep {held}; they keep {human_size(bound)} of them (--keep-memory) "
        f"and the other prompts run every layer in each trial (slower): raise --keep-memory or {fewer} to keep "
        "them all"
    )


def in_full_note(keep: Keep, prompts: int, what: str) -> str:
    """What a split past ``keep``'s bound holds, said once its passes are recorded."""
    return (
        f"{keep.in_full:,} of the {what}'s {prompts:,} prompts run every layer in each trial: their recordings "
        f"did not fit in {human_size(keep.bound)} (--keep-memory)"
    )


def record(
    model,
    prompts: Sequence[Encoded],
    batch_size: int,
    advance: Advance | None = None,
    groups: Sequence[list[int]] | None = None,
    keep: Keep | None = None,
) -> Recorded:
    """The baseline pass of this rank's batches of ``prompts`` (left-padded: the last position is each
    row's); ``groups``: the batches' rows (default: by length, ``batch_size`` a batch); ``keep``: the
    split's bound on what the recordings hold (None: everything)."""
    device, pad, out = input_device(model), pad_id(model), []
    work = distributed.Shard(batch_groups(prompts, batch_size) if groups is None else groups, len(prompts))
    for idx in work:
        batch = collate([prompts[i] for i in idx], idx, pad, SPAN_NAMES, device)
        snap = snapshot(model, batch)
        kept = keep(snap, len(idx)) if keep is not None else snap
        out.append((idx, kept))
        if kept is not snap:  # the recording just dropped leaves heap holes the next batch's may not fit in
            del snap
            trim_heap()
        work.done(idx)
        if advance:
            advance(len(idx))
    work.finish(advance)
    return Recorded(out, len(prompts))


def passes(model, recorded: Recorded, edits: Sequence[Edit]) -> Iterator[tuple[list[int], torch.Tensor]]:
    """(rows, fp32 log-softmax of their last position) of each batch under ``edits`` (none: baseline)."""
    for idx, snap in recorded.batches:
        logits = resume_scaled(model, snap, edits) if edits else snap.logits
        yield idx, logits.float().log_softmax(-1).cpu()


def last_logprobs(model, recorded: Recorded, edits: Sequence[Edit]) -> torch.Tensor:
    """(rows, vocab) fp32 log-softmax of the last position of this rank's prompts (``recorded.mine``,
    in that order) under ``edits``."""
    rows = [lp for _, lp in passes(model, recorded, edits)]
    return torch.cat(rows) if rows else torch.empty((0, 0))  # a rank with no batch (more ranks than batches)


def gather(recorded: Recorded, values: np.ndarray) -> np.ndarray:
    """Per-prompt ``values`` of this rank's prompts (``recorded.mine`` order) as all ``n``, in the
    prompts' order, on every rank."""
    return distributed.gather_rows(recorded.n, recorded.mine, values)


def first_token_kl(reference: torch.Tensor, edited: torch.Tensor) -> np.ndarray:
    """KL(reference ‖ edited) of the next-token distribution at each prompt's last position: the
    first-token KL of surgery.evaluation.lm.kl_divergence, per prompt."""
    return (reference.exp() * (reference - edited)).sum(-1).clamp_min(0.0).double().numpy()
