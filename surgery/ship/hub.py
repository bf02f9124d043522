"""Publish a baked checkpoint (or an exported adapter) to the Hugging Face Hub.

A folder is pushed only after it passes the structural check of ``surgery verify`` against its
recorded source (or, when that source is not on this machine, after every recorded sha256 is
checked), so a corrupted or hand-edited folder never reaches the Hub under surgery's name.
The token comes from huggingface_hub's usual sources (``HF_TOKEN``, ``hf auth login``); it is
never printed, logged or written anywhere by surgery.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..bake.card import CARD_NAME
from ..bake.pushable import ADAPTER_FILES, check_adapter, check_checkpoint, check_pushable, refuse_missing  # noqa: F401 (callers import them from here)
from ..bake.record import Pushed
from ..core.errors import SurgeryError
from ..core.hub_id import HUB_ID


class HubError(SurgeryError):
    """The Hub refused or could not be reached."""


def preflight(repo_id: str, revision: str | None = None, create_pr: bool = False) -> None:
    """What can be checked before any work: the repo id, the options, and that a token exists."""
    from huggingface_hub import get_token
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if not HUB_ID.match(repo_id):
        raise HubError(f"{repo_id!r} is not a Hub repo id; use NAMESPACE/NAME, e.g. me/model-edited")
    try:  # the Hub's own rules on names ('..', '--', a leading '-', 96 characters), before any work
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise HubError(f"{repo_id!r} is not a Hub repo id: {exc}") from None
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


def checked_uploads(baked: str | Path) -> tuple[str, dict[str, bytes | Path] | None]:
    """Check the bake output ``baked`` as a push takes it (``Container.check_pushable``) and return
    how it was checked and what the push uploads: None for a folder (as it is, its card inside),
    else {name in the repo: file or bytes}, with a card its container renders from the record (a
    baked GGUF is three files and no folder, so no card was written beside it)."""
    from ..core.container import open_container

    container = open_container(Path(baked))
    how, record = container.check_pushable()
    files = container.uploads()
    if files is None:
        return how, None
    return how, {**files, CARD_NAME: container.card(record).encode("utf-8")}


def folder_uploads(folder: Path) -> dict[str, Path]:
    """The files a push of ``folder`` uploads, by name in the repo: every file in it but those
    huggingface_hub's ``upload_folder`` leaves out (git's, its own cache's), by its own patterns."""
    from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects

    files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.glob("**/*")) if p.is_file()}
    return {name: files[name] for name in filter_repo_objects(files, ignore_patterns=DEFAULT_IGNORE_PATTERNS)}


def checked_push(
    folder: Path, repo_id: str, revision: str | None, create_pr: bool
) -> tuple[str, dict[str, bytes | Path] | None]:
    """Every check a push makes before its first request, in its order (:func:`checked_uploads`'s result)."""
    refuse_missing(folder)  # before the token: "no token" would send the user to log in, then to the typo
    preflight(repo_id, revision, create_pr)
    return checked_uploads(folder)


def commit_message(folder: Path, message: str | None) -> str:
    return message or f"Upload {folder.name} with surgery"


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
    rendered from its record (:func:`checked_uploads`)."""
    folder = Path(folder)
    how, files = checked_push(folder, repo_id, revision, create_pr)
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
            commit_message=commit_message(folder, message),
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
