"""Where a bake's findings come from: :class:`FindingsSource`, the command line's ``--findings``,
``--transfer`` and ``--recompute`` as one object, shared by the bakes that choose from findings
(``prune_neurons``, ``amplify_heads``) and the ``*_findings`` functions.

Like the other option objects, its fields may be given flat (``findings="f.json"``) or as one
object (``source=FindingsSource(findings="f.json", transfer=True)``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..core.errors import ParameterError
from ._common import given_path

if TYPE_CHECKING:
    from ..core.checkpoint import Checkpoint
    from ..find.findings import Found

FoundT = TypeVar("FoundT", bound="Found")


def findings_path(value: Any, name: str) -> Path:
    """A findings file given to an API function: a path (``~`` expanded), or the findings a
    ``find_*`` function returned (read from their file); anything else is one line naming ``name``."""
    from ..find.findings import Found

    return value.path if isinstance(value, Found) else given_path(value, name)


@dataclass(frozen=True)
class FindingsSource:
    """Which findings a bake reads.

    Attributes:
        findings: a findings file to read, or the findings a ``find_*`` function returned
            (default: the cache, computed on a miss).
        transfer: accept a findings file of another checkpoint of the same architecture.
        recompute: ignore cached findings and compute them again.
    """

    findings: str | Path | Found | None = None
    transfer: bool = False
    recompute: bool = False

    def __post_init__(self) -> None:
        # the findings find_* returned are their file: `amplify_heads(…, findings=find_heads(…))`
        if self.findings is not None:
            object.__setattr__(self, "findings", findings_path(self.findings, "findings"))

    def check_file(self) -> None:
        """``transfer`` applies to a findings file only: without one it is an error."""
        if self.transfer and self.findings is None:
            raise ParameterError(
                "{transfer} applies to {findings} from another checkpoint; give {findings} FILE", "transfer", "findings"
            )

    def read(
        self, found_type: type[FoundT], ckpt: Checkpoint, note: Callable[[str], None], *, check: bool = False
    ) -> FoundT | None:
        """The findings file given, as ``found_type`` checked against ``ckpt`` (``check``: its content
        too), its transfer note said; None when no file is given (then ``transfer`` is an error)."""
        if self.findings is None:
            self.check_file()
            return None
        found = found_type.read(self.findings, ckpt, self.transfer)
        if check:
            found.check()
        if found.transfer_note:
            note(found.transfer_note)
        return found
