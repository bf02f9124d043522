"""Second copies of the weights outside the loaded files: edited like the loaded ones, or refused.

A checkpoint folder may hold more ``.safetensors`` files than transformers loads (the index's
shards, else ``model.safetensors``): Mistral releases ship ``consolidated.safetensors`` next to
``model.safetensors`` — the same weights under their native names (``layers.N.attention.wo.weight``)
for mistral-inference and vLLM's Mistral format. Copied as is, such a file would serve the unedited
model to whatever reads it. So every ``.safetensors`` file outside the loaded set is one of:

- a known non-weight file (``NON_WEIGHT_FILES``): a PEFT adapter's ``adapter_model.safetensors``,
  as surgery's export-lora writes, holds low-rank factors, not the model's tensors; copied as is;
- a weight copy: every tensor in it is one of the loaded model's, by its own name or by the native
  name the architecture table maps to it (``Names.native_names``), with the same shape. Each
  edited tensor it holds gets the same byte plan as the loaded one (in its own dtype), recorded in
  surgery.json and surgery.undo and checked by verify; a copy that holds none is copied as is;
- anything else is refused in one line: a tensor surgery cannot match may be a copy the edit
  should have changed.

Bake, verify and push all decide through :func:`copy_patches` (push without the source on this
machine through :func:`unedited_copies`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..core.architectures import Architecture
from ..core.checkpoint import INDEX_NAME, Checkpoint, TensorInfo, file_tensors, folder_files
from ..core.counted import counted
from ..core.errors import CheckpointError
from ..core.patches import TensorPatch, group_by_file, patch_plan
from ..core.raw_values import RAW_DTYPES
from .record import BakeRecord

NON_WEIGHT_FILES = ("adapter_model.safetensors",)


def outside_files(ckpt: Checkpoint) -> list[str]:
    """The ``.safetensors`` files of ``ckpt``'s folder that transformers does not load, known
    non-weight files excepted."""
    loaded = set(ckpt.weight_files)
    return [
        rel
        for rel in folder_files(ckpt.path)
        if rel.endswith(".safetensors") and rel not in loaded and Path(rel).name not in NON_WEIGHT_FILES
    ]


def _refusal(ckpt: Checkpoint, rel: str, why: str) -> CheckpointError:
    loaded = INDEX_NAME if (ckpt.path / INDEX_NAME).is_file() else ", ".join(ckpt.weight_files)
    return CheckpointError(
        f"{ckpt.path / rel} is a weights file outside the ones transformers loads ({loaded}) and {why}, so "
        "it may be a second copy of the model that an edit would leave unedited: move it out of "
        f"{ckpt.path} (or delete it) and run again"
    )


def _matched(ckpt: Checkpoint, arch: Architecture, rel: str) -> dict[str, list[tuple[TensorInfo, bool]]]:
    """The tensors of the copy ``rel`` by the loaded name each one is, with ``permuted`` (see
    NativeName); a tensor that matches no loaded tensor's name and shape is refused."""
    matched: dict[str, list[tuple[TensorInfo, bool]]] = {}
    for name, info in sorted(file_tensors(ckpt.path, rel).items()):  # the first mismatch by name
        loaded, permuted = (name, False) if name in ckpt.tensors else arch.loaded_name(name) or (None, False)
        target = ckpt.tensors.get(loaded) if loaded else None
        if target is None:
            raise _refusal(
                ckpt,
                rel,
                f"its tensor '{name}' is none of the model's (by name, or by a native "
                f"name of {arch.model_type} that surgery knows)",
            )
        if target.shape != info.shape:
            raise _refusal(
                ckpt,
                rel,
                f"its tensor '{name}' has shape {list(info.shape)} where the model's "
                f"'{loaded}' has {list(target.shape)}",
            )
        matched.setdefault(loaded, []).append((info, permuted))
    return matched


def copy_patches(ckpt: Checkpoint, arch: Architecture, patches: list[TensorPatch]) -> list[TensorPatch]:
    """``patches`` (the plan on the loaded files) carried over to every weight copy outside them,
    one patch per edited tensor a copy holds. Raises CheckpointError (one line) for a file that is
    neither a known non-weight file nor a copy surgery can match, or whose edited tensor it cannot edit."""
    out = []
    for rel in outside_files(ckpt):
        matched = _matched(ckpt, arch, rel)
        for p in patches:
            for info, permuted in matched.get(p.info.name, ()):
                if permuted or info.dtype not in RAW_DTYPES:
                    why = (
                        "stores its rows in another order (permuted for RoPE)"
                        if permuted
                        else f"is stored as {info.dtype}"
                    )
                    raise _refusal(ckpt, rel, f"its copy '{info.name}' of the edited '{p.info.name}' {why}")
                out.append(replace(p, info=info, rows=dict(p.rows), cols=dict(p.cols)))  # projection too
    return out


def copy_note(copies: list[TensorPatch]) -> str:
    """The bake's note about the weight copies it edited."""
    files = sorted(group_by_file(copies))
    return (
        f"{', '.join(files)} {'holds' if len(files) == 1 else 'hold'} a second copy of the weights (outside the "
        f"ones transformers loads): edited the same way ({counted(len(copies), 'tensor')})"
    )


def unrecorded(copies: list[TensorPatch], record: BakeRecord) -> dict[str, str]:
    """The weight copies that hold edited tensors but that the bake recorded in ``record`` as not
    edited (bakes before this check copied them as is), each with its problem line."""
    recorded = {e.file for e in record.edited_tensors}
    return {
        rel: f"{rel} holds a copy of the edited tensor '{ps[0].info.name}' that the bake left unedited (it "
        "copied weight files outside the loaded ones as is): whatever loads it serves the unedited "
        "model; bake again"
        for rel, ps in sorted(group_by_file(copies).items())
        if rel not in recorded
    }


def unedited_copies(folder: Path, record: BakeRecord) -> list[str]:
    """The rule above on a baked ``folder`` alone (no source: push of a folder whose source is not
    on this machine), from its own files and ``record``."""
    ckpt = Checkpoint(folder, allow_remote_code=True)
    recipe = record.replayable_recipe(folder)
    arch = recipe.validate(ckpt.config)
    try:
        copies = copy_patches(ckpt, arch, patch_plan(ckpt, arch, recipe.active()))
    except CheckpointError as exc:
        return [str(exc)]
    return list(unrecorded(copies, record).values())
