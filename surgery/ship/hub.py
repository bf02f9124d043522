"""Publish a baked checkpoint (or an exported adapter) to the Hugging Face Hub.

A folder is pushed only after it passes the structural check of ``surgery verify`` against its
recorded source (or, when that source is not on this machine, after every recorded sha256 is
checked), so a corrupted or hand-edited folder never reaches the Hub under surgery's name.
The token comes from huggingface_hub's usual sources (``HF_TOKEN``, ``hf auth login``); it is
never printed, logged or written anywhere by surgery.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..bake.provenance import PROVENANCE_NAME, integrity_problems, load_provenance, not_baked, sweep_values
from ..bake.record import BakeRecord, Pushed
from ..bake.source_index import local_source_path
from ..core.checkpoint import Checkpoint, read_safetensors_header
from ..core.errors import CheckpointError, SurgeryError, VerificationError
from ..core.strict_files import load_json

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


class HubError(SurgeryError):
    """The Hub refused or could not be reached."""


def check_checkpoint(folder: Path) -> tuple[str, BakeRecord]:
    """Structural check of a baked folder; returns (how it was checked, its record)."""
    from ..bake.verify import structural

    record = load_provenance(folder)
    src_path = local_source_path(record.source)
    problems: list[str]
    if src_path is not None and (src_path / "config.json").is_file():
        report, _ = structural(Checkpoint(src_path, allow_remote_code=True), folder)
        problems, how = report.problems, f"structural check against the source {src_path}"
    else:
        from ..bake.copies import unedited_copies

        problems = integrity_problems(folder, record)
        problems = problems or unedited_copies(folder, record)  # the same rule as bake's and verify's
        how = "sha256 of every recorded file (source not on this machine)"
    if problems:
        raise VerificationError(
            f"{folder} fails verification ({problems[0]}"
            f"{f'; {len(problems) - 1} more problem(s)' if len(problems) > 1 else ''}); "
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


def check_pushable(folder: str | Path) -> tuple[str, BakeRecord | dict[str, Any]]:
    """Refuse anything but a verified surgery checkpoint or a readable adapter folder; returns how
    it was checked and the bake's record (the adapter's PEFT config)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SurgeryError(
            f"{folder} is not a folder; give a baked checkpoint or adapter folder, or a baked .gguf file"
        )
    if (folder / PROVENANCE_NAME).is_file():
        return check_checkpoint(folder)
    if all((folder / f).is_file() for f in ADAPTER_FILES):
        return check_adapter(folder)
    if sweep_values(folder):
        raise VerificationError(f"{not_baked(folder)}, or bake with --push-to (one branch per value)")
    raise VerificationError(
        f"{folder} has no {PROVENANCE_NAME}: only folders written by surgery (bake or export-lora) are pushed"
    )


def preflight(repo_id: str, revision: str | None = None, create_pr: bool = False) -> None:
    """What can be checked before any work: the repo id, the options, and that a token exists."""
    from huggingface_hub import get_token

    from ..model.loading import HUB_ID

    if not HUB_ID.match(repo_id):
        raise HubError(f"{repo_id!r} is not a Hub repo id; use NAMESPACE/NAME, e.g. me/model-edited")
    if create_pr and revision:
        raise HubError("--create-pr opens a pull request against main; drop --revision (or --create-pr)")
    if not get_token():
        raise HubError("no Hugging Face token found: run `hf auth login` or set HF_TOKEN to a token with write access")


def _api():
    from huggingface_hub import HfApi

    # HF_ENDPOINT is read here, not at import time, so a mirror or test hub set later is honoured.
    return HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)


def _hub_error(exc: BaseException, repo_id: str) -> HubError:
    """One line for the user; never the request headers (they hold the token)."""
    from huggingface_hub.errors import HfHubHTTPError

    while not isinstance(exc, HfHubHTTPError) and exc.__cause__ is not None:
        exc = exc.__cause__  # LFS upload failures arrive wrapped in a RuntimeError
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        status = exc.response.status_code
        if status in (401, 403):
            return HubError(
                f"the Hub refused the token for {repo_id} (HTTP {status}): log in with "
                "`hf auth login` or set HF_TOKEN to a token with write access to that namespace"
            )
        server = (getattr(exc, "server_message", None) or "").splitlines()
        return HubError(
            f"the Hub answered HTTP {status} for {repo_id}{': ' + server[0] if server and server[0] else ''}"
        )
    return HubError(f"cannot reach the Hub to push {repo_id} ({type(exc).__name__}); check the network or HF_ENDPOINT")


def _additions(files: dict[str, bytes | Path]) -> list:
    """One commit's operations: each file (or bytes) added under its name in the repo."""
    from huggingface_hub import CommitOperationAdd

    return [
        CommitOperationAdd(path_in_repo=name, path_or_fileobj=data if isinstance(data, bytes) else str(data))
        for name, data in files.items()
    ]


def push(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    create_pr: bool = False,
    message: str | None = None,
) -> Pushed:
    """Check ``folder``, create ``repo_id`` if needed (and branch ``revision``), upload every file in
    one commit. ``folder`` may be a baked GGUF file: it goes with its two sidecars and a model card
    rendered from its record (surgery/ship/gguf.py)."""
    from ..gguf import is_gguf

    folder = Path(folder)
    preflight(repo_id, revision, create_pr)
    files = None
    if is_gguf(folder) and folder.is_file():
        from .gguf import checked_upload

        how, files = checked_upload(folder)
    else:
        how, _ = check_pushable(folder)
    api = _api()
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        commit = dict(
            repo_id=repo_id,
            repo_type="model",
            revision=revision,
            create_pr=create_pr,
            commit_message=message or f"Upload {folder.name} with surgery",
        )
        if files is None:
            info = api.upload_folder(folder_path=str(folder), **commit)
        else:
            info = api.create_commit(operations=_additions(files), **commit)
    except (ValueError, OSError) as exc:
        if isinstance(exc, ValueError) and "README" in str(exc):
            raise HubError(f"the Hub rejected README.md's metadata: {str(exc).splitlines()[-1]}") from None
        raise _hub_error(exc, repo_id) from None
    except Exception as exc:  # huggingface_hub's HTTP errors do not share a narrower base class
        raise _hub_error(exc, repo_id) from None
    return Pushed(
        repo=repo_id,
        url=str(url),
        revision=revision or "main",
        commit=info.oid,
        commit_url=info.commit_url,
        pr_url=info.pr_url,
        checked=how,
    )
