"""DiffAware / CtxtAware under head edits: edge-level α during ``generate`` and whole-head α.

``surgery.evaluation.awareness.awareness`` tokenizes and generates on its own; edge-level α needs the token
positions of each row. A forward pre-hook sees the prompt pass of every ``generate`` call,
recognises each row by its exact token ids (the prompts are re-encoded here with the encoder
awareness uses, ``core.mcq.encode_question``) and installs the row's span masks in the
active plan. Rows that cannot be recognised are an error, never silently left unedited.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from ...core.edits import HeadScale
from ...core.errors import SurgeryError
from ...core.mcq import Encoded, encode_question
from ...model.hooks import applied
from .attention import AttentionPlan, EdgeEdit, active_plan, edge_heads
from .benchmark import question_spans

SPANS = ("tested", "item")


def encode_records(
    tokenizer, records: Sequence[Mapping[str, Any]], instruct: bool | None
) -> dict[tuple[int, ...], Encoded]:
    """Token ids → spans for every record that names its item and related option."""
    table = {}
    for r in records:
        spans = question_spans(r["question"], r.get("focus"), r.get("related_option"))
        if "item" in spans and "tested" in spans:
            enc = encode_question(tokenizer, r["question"], spans, instruct)
            table[enc.ids] = enc
    return table


@contextmanager
def edge_edit_in_generation(model, table: Mapping[tuple[int, ...], Encoded], edit: EdgeEdit) -> Iterator[AttentionPlan]:
    """While active, every prompt pass of ``model`` gets ``edit`` on the rows' own positions."""
    plan = AttentionPlan({}, edit=edit)

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None or ids.shape[1] == 1:  # decoding step: the prompt pass already set the plan
            return None
        att = kwargs.get("attention_mask")
        att = torch.ones_like(ids) if att is None else att
        masks = {name: torch.zeros(ids.shape, dtype=torch.bool, device=ids.device) for name in SPANS}
        for b in range(ids.shape[0]):
            real = att[b].bool()
            pad = int((~real).sum())
            if not real[pad:].all():
                raise SurgeryError("edge edits during generation need left padding")
            enc = table.get(tuple(ids[b, real].tolist()))
            if enc is None:
                raise SurgeryError(
                    "a generated prompt does not match any record's encoding; edge edits "
                    "need prompts made by surgery.evaluation.awareness (encode_question)"
                )
            for name in SPANS:
                masks[name][b, [pad + p for p in enc.spans[name]]] = True
        plan.masks = masks
        return None

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with active_plan(plan):
            yield plan
    finally:
        handle.remove()


def awareness_at(
    model,
    tokenizer,
    records: Sequence[Mapping[str, Any]],
    heads: Sequence[tuple[int, int]],
    alphas: Sequence[float],
    *,
    instruct: bool | None = None,
    batch_size: int = 8,
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """DiffAware / CtxtAware at each α, edge-level and whole-head, on the records that can be edited.

    The model must run the surgery attention function (attention.surgery_attention_on).
    """
    from ...evaluation.awareness import awareness

    table = encode_records(tokenizer, records, instruct)
    usable = [
        r
        for r in records
        if "item" in (sp := question_spans(r["question"], r.get("focus"), r.get("related_option"))) and "tested" in sp
    ]
    if not usable:
        raise SurgeryError(
            "no awareness record names its item and related option; use annotate_n4 or "
            "awareness_records to prepare them"
        )

    def measure() -> dict[str, Any]:
        res = awareness(model, tokenizer, usable, instruct=instruct, batch_size=batch_size, progress=progress)
        return {k: res[k] for k in ("diffaware", "ctxtaware", "n_diff", "n_equal")}

    rows = []
    base = None
    for alpha in alphas:
        if alpha == 1.0:
            base = base or measure()
            edge = whole = base
        else:
            with edge_edit_in_generation(model, table, EdgeEdit(edge_heads(list(heads)), float(alpha))):
                edge = measure()
            with applied(model, [HeadScale(layer, h, float(alpha)) for layer, h in heads]):
                whole = measure()
        rows.append({"alpha": float(alpha), "edge": edge, "whole": whole})
    return rows
