"""Check a baked checkpoint against its source: structure, bytes, hashes, and logits.

Structural: same config, tensor names, shapes, dtypes and offsets; every recorded sha256 matches;
every byte outside the recipe's slices equals the source; every byte inside equals what the recipe
prescribes. Numerical: the baked model's logits equal the source's with the run-time twins applied.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from ..core.checkpoint import Checkpoint, file_sha256, is_other_weights, read_header
from ..core.edits import Edit, Recipe
from ..core.errors import CheckpointError, SurgeryError
from ..core.progress import StageProgress, silent_stages
from ..model.loading import DEFAULT_LOAD, LoadSpec
from .bake import source_files
from .patches import RAW_DTYPES, TensorPatch, group_by_file, patched_chunks, plan
from .provenance import OWN_FILES, integrity_problems, load_provenance

BLOCK = 16 << 20
PROMPTS = (
    "The capital of France is",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
    "def add(a, b):\n    return",
)
TOLERANCE = {"F32": 1e-4, "F16": 5e-2, "BF16": 2.5e-1}


@dataclass
class Report:
    """What verify found; ``ok`` only when nothing is wrong."""

    problems: list[str] = field(default_factory=list)
    files_checked: int = 0
    tensors_edited: int = 0
    max_abs_logit_diff: float | None = None
    tolerance: float | None = None
    # Edited tensors whose content is not the recipe's: file, tensor, rows, columns, source_changed.
    mismatches: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": self.problems, "files_checked": self.files_checked,
                "tensors_edited": self.tensors_edited, "max_abs_logit_diff": self.max_abs_logit_diff,
                "tolerance": self.tolerance, "mismatches": self.mismatches}


def _ranges(indices: Iterable[int], limit: int = 4) -> str:
    """``[0, 1, 2, 7]`` → ``"0–2, 7"`` (at most ``limit`` runs, then how many more)."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(f"{a}–{b}" if b > a else str(a) for a, b in runs[:limit])
    return text + (f" and {len(runs) - limit} more range(s)" if len(runs) > limit else "")


def _differing(p: TensorPatch, offset: int, expected: bytes, actual: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(rows, columns) of the tensor where ``actual`` differs from ``expected`` (one row block)."""
    bits = np.dtype(f"u{np.dtype(RAW_DTYPES[p.info.dtype]).itemsize}")  # raw bits: NaN == NaN, -0 != +0
    want = np.frombuffer(expected, bits).reshape(-1, p.n_cols)
    have = np.frombuffer(actual, bits).reshape(-1, p.n_cols)
    first_row = (offset - p.info.start) // (p.n_cols * bits.itemsize)
    mask = want != have
    return first_row + np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))


def _mismatch(p: TensorPatch, dst: Path, rows: set[int], cols: set[int], source_changed: bool) -> tuple[str, dict]:
    """The problem line (and its JSON form) for an edited tensor that does not hold the recipe's values."""
    where = (f"elements {_ranges(rows)}" if len(p.info.shape) == 1 else
             f"rows {_ranges(rows)}, columns {_ranges(cols)}")
    why = (f"the source's {p.info.file} is not the one this folder was baked from (its sha256 differs from "
           "surgery.json's source_files): verify against the original source" if source_changed else
           "the output was changed after the bake (and surgery.json re-sealed to match): bake it again")
    line = f"{dst.name}: tensor '{p.info.name}' differs from what the recipe prescribes at {where}; {why}"
    return line, {"file": dst.name, "tensor": p.info.name, "rows": sorted(rows), "columns": sorted(cols),
                  "source_changed": source_changed}


def _compare_edited(src: Path, dst: Path, patches, report: Report, source_sha256: str | None = None) -> None:
    """Edited slices must hold the prescribed bytes and nothing else may differ.

    ``source_sha256`` is the source file's sha256 recorded at bake time: on a mismatch it tells a
    source that changed since the bake from an output that was altered.
    """
    covered: list[tuple[int, int]] = []
    fd_src, fd_dst = os.open(src, os.O_RDONLY), os.open(dst, os.O_RDONLY)
    try:
        for p in patches:
            rows: set[int] = set()
            cols: set[int] = set()
            for offset, expected, _ in patched_chunks(fd_src, p):
                actual = os.pread(fd_dst, len(expected), offset)
                if actual != expected and len(actual) == len(expected):
                    r, c = _differing(p, offset, expected, actual)
                    rows.update(r.tolist())
                    cols.update(c.tolist())
                # Covered either way: the scan below must not report the same bytes again.
                covered.append((offset, offset + len(expected)))
            if rows:
                changed = source_sha256 is not None and file_sha256(src) != source_sha256
                line, entry = _mismatch(p, dst, rows, cols, changed)
                report.problems.append(line)
                report.mismatches.append(entry)
        starts = np.array(sorted(c[0] for c in covered), dtype=np.int64)
        ends = np.array(sorted(c[1] for c in covered), dtype=np.int64)
        offset = 0
        while True:
            a, b = os.pread(fd_src, BLOCK, offset), os.pread(fd_dst, BLOCK, offset)
            if not a and not b:
                break
            if a != b:
                if len(a) != len(b):
                    report.problems.append(f"{dst.name}: size differs from the source's")
                    return
                diff = np.flatnonzero(np.frombuffer(a, np.uint8) != np.frombuffer(b, np.uint8)) + offset
                slot = np.searchsorted(starts, diff, side="right") - 1
                outside = (slot < 0) | (diff >= ends[np.maximum(slot, 0)]) if len(ends) else np.ones(len(diff), bool)
                if outside.any():
                    report.problems.append(f"{dst.name}: byte {int(diff[outside][0])} differs from the source "
                                           "outside the edited slices")
                    return
            offset += len(a)
    finally:
        os.close(fd_src)
        os.close(fd_dst)


def structural(src: Checkpoint, dst_path: Path, progress: StageProgress = silent_stages) -> tuple[Report, Recipe]:
    """Everything that can be checked without running the model; ``progress(stage, done, total)``
    follows the hashing of the output and the comparison with the source."""
    report = Report()
    prov = load_provenance(dst_path)
    recipe = Recipe.from_dict(prov.get("recipe"), where="surgery.json recipe")
    report.problems += integrity_problems(dst_path, prov, progress=progress)
    report.files_checked = len(prov.get("files") or {})
    if report.problems:
        return report, recipe

    dst = Checkpoint(dst_path, allow_remote_code=True)
    if dst.config != src.config:
        report.problems.append("config.json differs from the source's")
    for fname in sorted(set(src.weight_files) | set(dst.weight_files)):
        if fname not in dst.weight_files or fname not in src.weight_files:
            report.problems.append(f"weight file {fname} is in only one of source and output")
        elif read_header(src.path / fname) != read_header(dst_path / fname):
            report.problems.append(f"{fname}: tensor names, shapes, dtypes or offsets differ from the source")
    if report.problems:
        return report, recipe

    patches = plan(src, recipe.validate(src.config), recipe.active())
    report.tensors_edited = len(patches)
    by_file = group_by_file(patches)
    card_files = set(prov.get("undo", {}).get("replaced_files", [])) | set(prov.get("undo", {}).get("added_files", []))
    compared = [rel for rel in source_files(src)
                if rel not in OWN_FILES and rel not in card_files and not is_other_weights(rel)]  # not carried over
    for i, rel in enumerate(compared):
        progress("compare", i, len(compared))
        if not (dst_path / rel).is_file():
            report.problems.append(f"{rel} from the source is missing in the output")
        elif rel in by_file:
            _compare_edited(src.path / rel, dst_path / rel, by_file[rel], report,
                            (prov.get("source_files") or {}).get(rel))
        elif file_sha256(src.path / rel) != prov["files"].get(rel):
            report.problems.append(f"{rel} differs from the source's although the recipe does not touch it")
    progress("compare", len(compared), len(compared))
    return report, recipe


def _token_batches(path: Path, vocab: int, prompts: Iterable[str], load: LoadSpec = DEFAULT_LOAD) -> list:
    """Token ids for the prompts; fixed pseudo-random ids when the checkpoint has no tokenizer."""
    import torch

    prompts = list(prompts)
    files = {p.name for p in path.iterdir()}
    if {"tokenizer.json", "tokenizer.model", "vocab.json"} & files:
        from ..model.loading import load_tokenizer

        tok = load_tokenizer(path, load)
        batches = [tok(p, return_tensors="pt")["input_ids"] for p in prompts]
        for prompt, ids in zip(prompts, batches):
            if ids.numel() == 0:  # the model cannot run on an empty sequence: say why, not a reshape error
                raise CheckpointError(
                    f"the tokenizer of {path} encodes the check prompt {prompt!r} to no tokens (its vocabulary "
                    "does not cover the text), so the logits cannot be compared; fix the tokenizer, or skip "
                    "the logit check (bake with --no-verify, verify with --structural-only)")
        return batches
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (1, 12), generator=gen) for _ in prompts]


def logits(path: Path, batches: list, edits: Iterable[Edit] = (), load: LoadSpec = DEFAULT_LOAD) -> list:
    """fp32 logits of the checkpoint at ``path`` for each batch, with ``edits`` as run-time hooks."""
    import torch

    from ..model.hooks import applied
    from ..model.loading import load_model
    from ..model.placement import input_device

    model = load_model(path, load)
    with torch.inference_mode(), applied(model, list(edits)):
        out = [model(input_ids=b.to(input_device(model))).logits.float().cpu() for b in batches]
    del model
    return out


def numeric(src: Checkpoint, dst_path: Path, recipe: Recipe, prompts: Iterable[str] = PROMPTS,
            load: LoadSpec = DEFAULT_LOAD, progress: StageProgress = silent_stages) -> tuple[float, float]:
    """max |Δlogit| between the baked model and the source with run-time twins, and the tolerance."""
    from ..core.architectures import text_config

    vocab = int(text_config(src.config).get("vocab_size") or src.config.get("vocab_size"))
    batches = _token_batches(src.path, vocab, prompts, load)
    progress("verify", 0, 2)
    reference = logits(src.path, batches, recipe.active(), load)
    progress("verify", 1, 2)
    baked = logits(dst_path, batches, load=load)
    progress("verify", 2, 2)
    diff = max(float((a - b).abs().max()) for a, b in zip(reference, baked))
    dtypes = {src.tensors[p.info.name].dtype for p in plan(src, recipe.validate(src.config), recipe.active())}
    tol = max((TOLERANCE.get(d, TOLERANCE["BF16"]) for d in dtypes), default=TOLERANCE["F32"])
    return diff, tol


def verify(src: Checkpoint, dst_path: str | Path, run_model: bool = True, load: LoadSpec = DEFAULT_LOAD,
           progress: StageProgress = silent_stages) -> Report:
    """Full verification of ``dst_path`` against ``src``; see the module docstring."""
    dst_path = Path(dst_path)
    report, recipe = structural(src, dst_path, progress)
    if report.ok and run_model:
        report.max_abs_logit_diff, report.tolerance = numeric(src, dst_path, recipe, load=load, progress=progress)
        if not report.max_abs_logit_diff <= report.tolerance:
            report.problems.append(f"baked logits differ from the run-time edit by "
                                   f"{report.max_abs_logit_diff:.3g} (tolerance {report.tolerance:g})")
    return report


def staged_check(src: Checkpoint, recipe: Recipe, load: LoadSpec = DEFAULT_LOAD) -> Callable[[Path], dict[str, Any]]:
    """The numerical check as a bake hook: runs on the staged output before it is published."""

    def check(staged: Path) -> dict[str, Any]:
        diff, tol = numeric(src, staged, recipe, load=load)
        if not diff <= tol:
            raise SurgeryError(f"the baked weights do not reproduce the run-time edit (max |Δlogit| "
                               f"{diff:.3g} > {tol:g}); nothing was written. Please report this bug")
        return {"max_abs_logit_diff": diff, "tolerance": tol, "prompts": len(PROMPTS), "reference": "run-time hooks"}

    return check


def dumps(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=1)
