"""An evaluation onto a baked folder's card: the result checked to be of this very bake (and of the
source it was baked from), then the card rewritten from the record (surgery/bake/card.py renders it)
with surgery.json's hashes and undo data kept consistent.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..bake.card import CARD_NAME
from ..bake.folder_container import FolderContainer
from ..bake.provenance import PROVENANCE_NAME, integrity_problems, load_provenance, record_text
from ..bake.record import BakeRecord
from ..core.checkpoint import Checkpoint, file_sha256
from ..core.errors import EvaluationError, VerificationError
from ..core.evaluation_result import card_summary, measured
from ..core.evaluation_table import Evaluation
from ..core.staging import atomic_write_text


def check_evaluated(
    folder: Path, record: BakeRecord, result: Mapping[str, Any], where: str, fix: str | None = None
) -> None:
    """Refuse an eval ``result`` (read from ``where``) that did not measure the bake in ``folder``,
    or whose source column measured another model than the one it was baked from (``fix``: what
    to do instead; default: run the evaluation again).

    The bake is named by its fingerprint and the sha256 of its weight files (the fingerprint alone
    samples 1 MiB per file: on a real model it does not tell a bake from its source). A result
    without the ``weights_sha256`` entry (surgery eval before it was recorded) is refused too: it may
    be an evaluation of the source or of another α, whose numbers must not reach this model's card.
    """
    fix = fix or (
        f"re-run `surgery eval {folder} --against SOURCE --out {where}` with the source it was "
        "baked from, then give that file"
    )
    model = result.get("model") or {}
    if not model.get("fingerprint") or "weights_sha256" not in model:
        raise EvaluationError(f"{where} does not record which bake it measured (written by an older surgery); {fix}")
    if (
        model["weights_sha256"] != record.weight_hashes()
        or model["fingerprint"] != Checkpoint(folder, allow_remote_code=True).fingerprint()
    ):
        raise EvaluationError(
            f"{where} is an evaluation of another model ({model.get('path')}), not of {folder}; {fix}"
        )
    against, source = result.get("against") or {}, record.source.fingerprint
    if against and source and against.get("fingerprint") != source:
        raise EvaluationError(
            f"{where} compares with {against.get('path')}, which is not the source {folder} was baked from; {fix}"
        )


def check_card_evaluation(folder: str | Path, against: Path | None) -> None:
    """Before ``surgery eval FOLDER --card``: FOLDER must be a bake, and ``against`` the source it was
    baked from, so that a long evaluation does not end in a refused card (:func:`check_evaluated`)."""
    folder = Path(folder)
    plan = {"model": measured(folder), "against": measured(against) if against is not None else None}
    check_evaluated(
        folder,
        load_provenance(folder),
        plan,
        "this evaluation",
        "give --against the source it was baked from (or leave --against out)",
    )


def card_with_evaluation(folder: str | Path, result: Mapping[str, Any], where: str = "the eval result") -> Path:
    """Put the before/after table of eval ``result`` into the card of the baked ``folder``, after
    :func:`check_evaluated`; see :func:`refresh_card`."""
    folder = Path(folder)
    check_evaluated(folder, load_provenance(folder), result, where)
    return refresh_card(folder, card_summary(result))


def refresh_card(folder: str | Path, evaluation: Evaluation | None = None) -> Path:
    """Rewrite the card of a baked ``folder`` (optionally with ``evaluation``); update surgery.json.

    Every other recorded file must still match its sha256 (a tampered folder is not blessed). The
    README is written first, then surgery.json: rerunning after an interruption repairs the pair.
    """
    folder = Path(folder)
    record = load_provenance(folder)
    problems = integrity_problems(folder, record, skip=[CARD_NAME])  # the card itself is about to change
    if problems:
        raise VerificationError(f"{folder} fails verification ({problems[0]}); refusing to rewrite the card")
    files = dict(record.files)
    if CARD_NAME not in record.undo.rewritten():
        if (folder / CARD_NAME).is_file():
            raise VerificationError(
                f"{folder} carries the source's README.md without undo data for it; "
                "bake again with a card instead of rewriting it"
            )
        record.undo.added_files.append(CARD_NAME)
    if evaluation is not None:
        record.evaluation = evaluation
    text = FolderContainer(folder).card(record)
    mode = (folder / PROVENANCE_NAME).stat().st_mode & 0o777  # temporary files are created 0600
    atomic_write_text(folder / CARD_NAME, text)
    os.chmod(folder / CARD_NAME, mode)
    files[CARD_NAME] = file_sha256(folder / CARD_NAME)
    record.files = dict(sorted(files.items()))
    atomic_write_text(folder / PROVENANCE_NAME, record_text(record))
    os.chmod(folder / PROVENANCE_NAME, mode)
    return folder / CARD_NAME
