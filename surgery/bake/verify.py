"""Check a baked checkpoint against its source: structure, bytes, hashes, and logits.

Structural: same config, tensor names, shapes, dtypes and offsets; every recorded sha256 matches;
every byte outside the recipe's slices equals the source; every byte inside equals what the recipe
prescribes. Numerical: the baked model's logits equal the source's with the run-time twins applied,
both computed on one loaded model (the source, then the source with the edited tensors swapped in).
Every sha256 is recomputed from the bytes, of the output and of the source, whatever surgery.json
says was taken rather than computed at bake time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.checkpoint import Checkpoint, file_sha256, is_other_weights, read_safetensors_header
from ..core.counted import counted
from ..core.edits import Recipe
from ..core.errors import CheckpointError
from ..core.patches import TensorPatch, group_by_file, patch_plan, patched_chunks
from ..core.progress import StageProgress, silent_stages
from ..core.raw_values import FLOAT_DTYPES, RAW_DTYPES
from ..model.loading import DEFAULT_LOAD, LoadSpec
from .bake import source_files
from .copies import copy_patches, unrecorded
from .provenance import OWN_FILES, integrity_problems, load_provenance
from .record import BakeRecord
from .tolerance import LogitTolerance, logit_tolerance

BLOCK = 16 << 20
PROMPTS = (
    "The capital of France is",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
    "def add(a, b):\n    return",
)
COMPUTE_DTYPES = {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16"}


@dataclass
class Report:
    """What verify found; ``ok`` only when nothing is wrong."""

    problems: list[str] = field(default_factory=list)
    files_checked: int = 0
    tensors_edited: int = 0
    max_abs_logit_diff: float | None = None
    tolerance: float | None = None
    tolerance_basis: LogitTolerance | None = None  # what the tolerance was derived from
    numeric_check: str = "logits"  # what the numeric check compared (an FP8 checkpoint: dequantized weights)
    # Edited tensors whose content is not the recipe's: file, tensor, rows, columns, source_changed.
    mismatches: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "problems": self.problems,
            "files_checked": self.files_checked,
            "tensors_edited": self.tensors_edited,
            "max_abs_logit_diff": self.max_abs_logit_diff,
            "tolerance": self.tolerance,
            "tolerance_basis": None if self.tolerance_basis is None else self.tolerance_basis.to_dict(),
            "numeric_check": self.numeric_check,
            "mismatches": self.mismatches,
        }


def _ranges(indices: Iterable[int], limit: int = 4) -> str:
    """``[0, 1, 2, 7]`` → ``"0–2, 7"`` (at most ``limit`` runs, then how many more)."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(f"{a}–{b}" if b > a else str(a) for a, b in runs[:limit])
    return text + (f" and {counted(len(runs) - limit, 'more range')}" if len(runs) > limit else "")


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
    where = f"elements {_ranges(rows)}" if len(p.info.shape) == 1 else f"rows {_ranges(rows)}, columns {_ranges(cols)}"
    why = (
        f"the source's {p.info.file} is not the one this folder was baked from (its sha256 differs from "
        "surgery.json's source_files): verify against the original source"
        if source_changed
        else "the output was changed after the bake (and surgery.json re-sealed to match): bake it again"
    )
    line = f"{dst.name}: tensor '{p.info.name}' differs from what the recipe prescribes at {where}; {why}"
    return line, {
        "file": dst.name,
        "tensor": p.info.name,
        "rows": sorted(rows),
        "columns": sorted(cols),
        "source_changed": source_changed,
    }


def source_changed_line(rel: str) -> str:
    """The problem line for a source file whose content is not the one recorded at bake time."""
    return (
        f"the source's {rel} no longer matches the sha256 recorded at bake time (surgery.json source_files): "
        "the source changed after the bake, or is another model; verify against the source this folder "
        "was baked from"
    )


def _compare_edited(src: Path, dst: Path, patches, report: Report, source_changed: bool = False) -> bool:
    """Edited slices must hold the prescribed bytes and nothing else may differ; True when something
    outside the edited slices differs.

    ``source_changed``: the source file's sha256 is not the one recorded at bake time. A mismatch
    is then blamed on the source, not on the output; a difference outside the edited slices is left
    to the caller's plain line (:func:`source_changed_line`), not located as if the output were damaged.
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
                line, entry = _mismatch(p, dst, rows, cols, source_changed)
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
                    if not source_changed:
                        report.problems.append(f"{dst.name}: size differs from the source's")
                    return True
                diff = np.flatnonzero(np.frombuffer(a, np.uint8) != np.frombuffer(b, np.uint8)) + offset
                slot = np.searchsorted(starts, diff, side="right") - 1
                outside = (slot < 0) | (diff >= ends[np.maximum(slot, 0)]) if len(ends) else np.ones(len(diff), bool)
                if outside.any():
                    if not source_changed:
                        report.problems.append(
                            f"{dst.name}: byte {int(diff[outside][0])} differs from the "
                            "source outside the edited slices"
                        )
                    return True
            offset += len(a)
    finally:
        os.close(fd_src)
        os.close(fd_dst)
    return False


def _changed_sources(
    src: Checkpoint, record: BakeRecord, names: list[str], progress: StageProgress
) -> tuple[dict[str, str], set[str]]:
    """sha256 of each source file in ``names`` now, and those that no longer match the sha256
    recorded at bake time (surgery.json source_files)."""
    recorded = record.source_files
    current = {}
    for i, rel in enumerate(names):
        progress("compare", i, 2 * len(names))
        current[rel] = file_sha256(src.path / rel)
    return current, {rel for rel, digest in current.items() if rel in recorded and digest != recorded[rel]}


def structural(src: Checkpoint, dst_path: Path, progress: StageProgress = silent_stages) -> tuple[Report, Recipe]:
    """Everything that can be checked without running the model; ``progress(stage, done, total)``
    follows the hashing of the output and the comparison with the source.

    The source is checked against its sha256s recorded at bake time first: a source file that
    changed since is said to be so (:func:`source_changed_line`), never reported as damage to the
    output; only an edited tensor that does not hold the recipe's values is still located in it.
    """
    report = Report()
    record = load_provenance(dst_path)
    recipe = record.replayable_recipe(dst_path)
    report.problems += integrity_problems(dst_path, record, progress=progress)
    report.files_checked = len(record.files)
    if report.problems:
        return report, recipe

    card_files = record.undo.rewritten()
    compared = [
        rel for rel in source_files(src) if rel not in OWN_FILES and rel not in card_files and not is_other_weights(rel)
    ]  # not carried over
    current, changed = _changed_sources(src, record, compared, progress)
    dst = Checkpoint(dst_path, allow_remote_code=True)
    if dst.config != src.config and "config.json" not in changed:
        report.problems.append("config.json differs from the source's")
    for fname in sorted(set(src.weight_files) | set(dst.weight_files)):
        if fname not in dst.weight_files or fname not in src.weight_files:
            report.problems.append(f"weight file {fname} is in only one of source and output")
        elif fname not in changed and read_safetensors_header(src.path / fname) != read_safetensors_header(
            dst_path / fname
        ):
            report.problems.append(f"{fname}: tensor names, shapes, dtypes or offsets differ from the source")
    if report.problems or "config.json" in changed:  # the recipe is planned on the source's config
        here = src.config.get("model_type")
        if "config.json" in changed and here != record.model_type:
            # Another architecture, not a changed source: one line says so instead of one per file.
            report.problems = [
                f"{src.path} is a {here} model, but {dst_path} was baked from "
                f"{record.source.hub_id or record.source.path}, a {record.model_type} model: "
                "give the source this folder was baked from"
            ]
            return report, recipe
        report.problems += [source_changed_line(rel) for rel in sorted(changed)]
        return report, recipe

    arch = recipe.validate(src.config)
    patches = src.format.plan(src, arch, recipe.active())
    try:
        copies = copy_patches(src, arch, patches)
    except CheckpointError as exc:  # a weights file the bake cannot match: it was copied as is
        report.problems.append(str(exc))
        return report, recipe
    # distinct tensors, as the bake counts them: a fused expert tensor is one patch per expert window
    report.tensors_edited = len({(p.info.file, p.info.name) for p in patches + copies})
    left_unedited = unrecorded(copies, record)
    report.problems += left_unedited.values()
    by_file = group_by_file(patches + copies)
    for i, rel in enumerate(compared):
        progress("compare", len(compared) + i, 2 * len(compared))
        if not (dst_path / rel).is_file():
            report.problems.append(f"{rel} from the source is missing in the output")
        elif rel in left_unedited:
            continue  # said above
        elif rel in by_file:
            before = len(report.problems)
            outside = _compare_edited(src.path / rel, dst_path / rel, by_file[rel], report, rel in changed)
            if rel in changed and len(report.problems) == before:
                # Nothing differs but the sha256: the output holds the recipe's bytes over this very
                # source, so the record is wrong (a Hub blob named with a wrong sha256 at bake time).
                report.problems.append(
                    source_changed_line(rel)
                    if outside
                    else f"surgery.json records a sha256 for the source's {rel} that its content "
                    "does not have (source_files); undo would refuse to restore it"
                )
        elif rel in changed:
            report.problems.append(source_changed_line(rel))
        elif current[rel] != record.files.get(rel):
            report.problems.append(f"{rel} differs from the source's although the recipe does not touch it")
    progress("compare", 2 * len(compared), 2 * len(compared))
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
                    "the logit check (verify with --structural-only)"
                )
        return batches
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (1, 12), generator=gen) for _ in prompts]


def _forward(model, batches: list) -> list:
    """fp32 logits of ``model`` for each batch."""
    import torch

    from ..model.placement import input_device

    device = input_device(model)
    with torch.inference_mode():
        return [model(input_ids=b.to(device)).logits.float().cpu() for b in batches]


def baked_tensors(src: Checkpoint, dst_path: Path, recipe: Recipe, model) -> dict | None:
    """The edited tensors of the output, by their parameter names in ``model`` (read from disk one
    by one: the structural check has proven every other byte identical to the source); None when
    an edited tensor has no parameter of its own in memory (experts, fused by transformers)."""
    from safetensors import safe_open

    from ..core.resolve import Resolver
    from ..core.sites import all_sites
    from ..model.hooks import model_architecture

    arch = recipe.validate(src.config)
    edited = {p.info.name for p in patch_plan(src, arch, recipe.active())}
    params = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    loaded = model_architecture(model)
    in_memory = loaded.layer_prefix(params)
    out = {}
    for sl in Resolver(arch, src.tensors).all(all_sites(arch, recipe.active())):
        disk, site = sl.tensor, sl.site
        if site.layer is None:
            # The embedding table: a tied one would be untied by a swap, and a family that declares a tie
            # its config turns off (Youtu) gave a stale first forward after the swap; the baked model is loaded.
            return None
        if disk in edited and disk not in out and site.expert is None:
            with safe_open(str(dst_path / src.tensor(disk).file), "pt") as f:
                # the site's module under the loaded model's layer prefix (multimodal wrappers and
                # renamed checkpoints store it under another name), or next to its layer list (embeddings)
                part = "bias" if sl.is_bias else "weight"
                if site.layer is None:
                    memory = f"{loaded.root_prefix(params)}{site.module}.{part}"
                else:
                    memory = f"{loaded.module_name(in_memory, site.layer, site.module)}.{part}"
                out[disk] = (memory, f.get_tensor(disk))
    if edited - set(out):
        return None  # expert tensors: stored per expert, fused in memory; no one-to-one swap
    return dict(out.values())


def numeric(
    src: Checkpoint,
    dst_path: Path,
    recipe: Recipe,
    prompts: Iterable[str] = PROMPTS,
    load: LoadSpec = DEFAULT_LOAD,
    progress: StageProgress = silent_stages,
    model=None,
) -> tuple[float, LogitTolerance]:
    """max |Δlogit| between the baked model and the source with run-time twins, and the tolerance
    (surgery/bake/tolerance.py: from the dtypes, the run-time edit's largest logit and the depth).

    The source is loaded once (or ``model``, already loaded from it, is used and left as it was):
    its logits with the run-time twins, then with only the edited tensors swapped for the baked
    ones. Peak memory is one model plus the edited tensors, with any accelerate device map.
    """
    import torch

    from ..core.freed_memory import return_freed_memory
    from ..model.dequantized import holds_codes
    from ..model.hooks import applied
    from ..model.loading import load_model, vocab_rows
    from ..model.probe import check_runs, load_or_refuse
    from ..model.swap import swapped
    from ..model.upcast import compute_dtype_of

    batches = _token_batches(src.path, vocab_rows(src.config), prompts, load)
    progress("verify", 0, 2)
    # A failure is asked again of transformers alone (the model built, the unedited model run): where that
    # fails too, the checkpoint's config is at fault, said in one line; else it is surgery's, raised as is.
    if model is None:
        model = load_or_refuse(src.path, load)
    try:
        with applied(model, recipe.active()):
            reference = _forward(model, batches)
    except Exception:
        check_runs(model, batches[0], src.path)
        raise
    progress("verify", 1, 2)
    # a quantized checkpoint's edited tensors are codes and scales, not the dequantized weights in memory
    tensors = None if src.quantized else baked_tensors(src, dst_path, recipe, model)
    if tensors is not None:
        with swapped(model, tensors):
            baked = _forward(model, batches)
    else:  # experts or integer codes: the baked model is loaded too (after the source is freed)
        del model
        # the source's held tensors came from the C heap: its pages go back first, or both models are held
        return_freed_memory()
        baked_model = load_model(dst_path, load)
        baked = _forward(baked_model, batches)
        model = baked_model
    progress("verify", 2, 2)
    # torch's max keeps a NaN (a damaged weight can make one), where Python's max may drop it
    diff = float(torch.stack([(a - b).abs().max() for a, b in zip(reference, baked)]).max())
    view = src.format.view(src)  # an integer weight: its logical dtype, which has the default (bf16) tolerance
    arch = recipe.validate(src.config)
    edited = [p.info.name for p in patch_plan(view, arch, recipe.active())]
    dtypes = {view.tensor(name).dtype for name in edited}
    # loaded dequantized into the compute dtype, exactly (FP8; integer codes surgery decodes or holds): codes do not
    # run, but a plain float tensor beside them (gpt-oss's bf16 attention next to its MXFP4 experts) is still rounded
    if src.format.loads_dequantized or holds_codes(model):
        stored = src.tensors
        # the view gives a quantized weight its logical dtype; what the file stores decides whether it is rounded
        dtypes = {stored[name].dtype for name in edited if name in stored and stored[name].dtype in FLOAT_DTYPES}
    # The model may also compute in a narrower dtype than it stores (--dtype bfloat16 on float32 weights).
    dtypes.add(COMPUTE_DTYPES.get(str(compute_dtype_of(model)), "F32"))
    largest = max(float(a.abs().max()) for a in reference)
    return diff, logit_tolerance(dtypes, largest, arch.geometry.num_layers)


def verify(
    src: Checkpoint,
    dst_path: str | Path,
    run_model: bool = True,
    load: LoadSpec = DEFAULT_LOAD,
    progress: StageProgress = silent_stages,
    model=None,
) -> Report:
    """Full verification of ``dst_path`` against ``src``; see the module docstring. ``model``: the
    source already loaded (e.g. with a device map), used instead of loading it."""
    dst_path = Path(dst_path)
    report, recipe = structural(src, dst_path, progress)
    report.numeric_check = "logits" if run_model else "none (structural only: no model loaded)"
    if report.ok and run_model and src.quantized:
        # the edit itself, exactly: the edited weights dequantized against the source's times the recipe's
        # scales; then logits, both models loaded dequantized (FP8: surgery/formats/fp8/hold.py; integer codes by
        # transformers where it decompresses them, else, or held for float32, surgery/formats/int_packed/hold.py)
        report.numeric_check = "dequantized weights: the output's equal the recipe's scales times the source's, exactly"
        report.problems += src.format.check(src, Checkpoint(dst_path, allow_remote_code=True), recipe)[1]
    if report.ok and run_model:
        if src.quantized:
            report.numeric_check += "; and logits (both models loaded dequantized)"
        report.max_abs_logit_diff, report.tolerance_basis = numeric(
            src, dst_path, recipe, load=load, progress=progress, model=model
        )
        report.tolerance = report.tolerance_basis.value
        if not report.max_abs_logit_diff <= report.tolerance:
            report.problems.append(
                f"baked logits differ from the run-time edit by {report.max_abs_logit_diff:.3g} "
                f"(tolerance {report.tolerance:.3g} = {report.tolerance_basis.describe()})"
            )
    return report


def dumps(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=1)
