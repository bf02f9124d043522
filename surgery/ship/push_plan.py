"""``surgery push --dry-run``: every check a push makes before its first request (the folder or
GGUF bake verified, the repo id, the options, a token present, the model card's metadata), then what
it would upload, with no request to the Hub.

What only the Hub can say is left to the push itself: whether the repo exists (an existing one keeps
its visibility), whether the token may write to it, and the Hub's own check of the card's metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..bake.card import CARD_NAME
from ..core.json_record import JsonRecord, entry, listof, part
from .hub import HubError, checked_push, commit_message, folder_uploads


@dataclass(kw_only=True)
class Upload(JsonRecord):
    """One file a push would upload: its name in the repo and its size in bytes."""

    name: str
    size: int


@dataclass(kw_only=True)
class PushPlan(JsonRecord):
    """What a push would do (``push --dry-run --json``): nothing was sent."""

    dry_run: bool = True
    repo: str
    private: bool  # a new repo is created so; an existing one keeps its visibility
    revision: str
    create_pr: bool
    message: str
    checked: str
    card: str | None = entry(default=None, keep_none=True)  # where the model card comes from; None: none
    files: list[Upload] = entry(codec=listof(part(Upload)))

    LABEL: ClassVar[str] = "push plan"

    @property
    def size(self) -> int:
        """Bytes to upload, all files together."""
        return sum(f.size for f in self.files)


def _check_card(text: str) -> None:
    """The card's metadata (YAML front matter) parses as huggingface_hub parses it before a push;
    the Hub's own check of its values needs a request, which a dry run does not make."""
    import yaml
    from huggingface_hub import ModelCard

    try:
        ModelCard(text)
    except (ValueError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise HubError(f"the model card's metadata does not parse ({first}): fix README.md's front matter") from None


def plan_push(
    folder: Path, repo_id: str, *, private: bool, revision: str | None, create_pr: bool, message: str | None
) -> PushPlan:
    """Make every check :func:`surgery.ship.hub.push` makes and return what it would upload."""
    how, given = checked_push(folder, repo_id, revision, create_pr)
    files = folder_uploads(folder) if given is None else given
    card = files.get(CARD_NAME)
    if card is not None:
        _check_card(card.decode("utf-8") if isinstance(card, bytes) else card.read_text(encoding="utf-8"))
    return PushPlan(
        repo=repo_id,
        private=private,
        revision=revision or "main",
        create_pr=create_pr,
        message=commit_message(folder, message),
        checked=how,
        card=None
        if card is None
        else f"{CARD_NAME} {'in the folder' if isinstance(card, Path) else 'from the record'}",
        files=[Upload(name=n, size=len(d) if isinstance(d, bytes) else d.stat().st_size) for n, d in files.items()],
    )
