"""What may be pushed: a baked folder that passes verification's structural check against its
recorded source (or, when that source is not on this machine, every recorded sha256), or an exported
adapter whose config and weights header read; anything else is refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.checkpoint import Checkpoint, read_safetensors_header
from ..core.counted import counted
from ..core.errors import CheckpointError, SurgeryError, VerificationError
from ..core.strict_files import load_json
from .provenance import PROVENANCE_NAME, integrity_problems, load_provenance, not_baked, sweep_values
from .record import BakeRecord
from .source_index import local_source_path

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def check_checkpoint(folder: Path) -> tuple[str, BakeRecord]:
    """Structural check of a baked folder; returns (how it was checked, its record)."""
    from .verify import structural

    record = load_provenance(folder)
    src_path = local_source_path(record.source)
    problems: list[str]
    if src_path is not None and (src_path / "config.json").is_file():
        report, _ = structural(Checkpoint(src_path, allow_remote_code=True), folder)
        problems, how = report.problems, f"structural check against the source {src_path}"
    else:
        from .copies import unedited_copies

        problems = integrity_problems(folder, record)
        problems = problems or unedited_copies(folder, record)  # the same rule as bake's and verify's
        how = "sha256 of every recorded file (source not on this machine)"
    if problems:
        raise VerificationError(
            f"{folder} fails verification ({problems[0]}"
            f"{'; ' + counted(len(problems) - 1, 'more problem') if len(problems) > 1 else ''}); "
            "refusing to push: bake it again"
        )
    return how, record


def check_adapter(folder: Path) -> tuple[str, dict[str, Any]]:
    """An exported adapter: its config parses and its weights have a valid safetensors header."""
    try:
        config = load_json((folder / "adapter_config.json").read_text(encoding="utf-8"))
        read_safetensors_header(folder / "adapter_model.safetensors")
    except (OSError, json.JSONDecodeError, CheckpointError) as exc:
        raise VerificationError(f"{folder} is not a valid adapter ({exc}); export it again") from None
    return "adapter config and weights header", config


def refuse_missing(path: Path) -> None:
    """A path that is not there, or a sweep's folder, in one line (push says it before the token check:
    the path first, then "log in")."""
    if not path.exists():
        raise SurgeryError(f"{path} does not exist; give a baked checkpoint or adapter folder, or a baked .gguf file")
    if not (path / PROVENANCE_NAME).is_file() and sweep_values(path):
        raise VerificationError(f"{not_baked(path)}, or bake with --push-to (one branch per value)")


def check_pushable(folder: str | Path) -> tuple[str, BakeRecord | dict[str, Any]]:
    """Refuse anything but a verified surgery checkpoint or a readable adapter folder; returns how
    it was checked and the bake's record (the adapter's PEFT config)."""
    folder = Path(folder)
    refuse_missing(folder)
    if not folder.is_dir():
        raise SurgeryError(
            f"{folder} is not a folder; give a baked checkpoint or adapter folder, or a baked .gguf file"
        )
    if (folder / PROVENANCE_NAME).is_file():
        return check_checkpoint(folder)
    if all((folder / f).is_file() for f in ADAPTER_FILES):
        return check_adapter(folder)
    raise VerificationError(
        f"{folder} has no {PROVENANCE_NAME}: only folders written by surgery (bake or export-lora) are pushed"
    )
