"""A GGUF file as a container: the bake writes a .gguf with only the edited blocks changed and two
sidecars beside it (surgery/bake/gguf.py); verify and undo read the sidecars alone
(surgery/bake/gguf_verify.py); a push uploads the three files, its card rendered from the record
(surgery/bake/gguf_card.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.container import BakeCall, Container, Opened
from ..core.errors import DestinationError, RecipeError
from ..core.progress import StageProgress
from ..gguf import SUFFIX, is_gguf

if TYPE_CHECKING:
    from .bake import BakeResult


def sweep_outputs(out: Path, labels: Sequence[str]) -> dict[str, Path]:
    """Where each value of a GGUF sweep goes: ``OUT/<label>.gguf`` (``OUT`` a folder, as a folder
    sweep's ``OUT/<label>``)."""
    if is_gguf(out):
        raise DestinationError(
            f"--out {out} is a .gguf file, but a sweep writes one .gguf per value: give a "
            f"folder (e.g. --out {out.with_suffix('')}: {labels[0]}{SUFFIX}, … go into it)"
        )
    return {label: out / f"{label}{SUFFIX}" for label in labels}


class GgufContainer(Container):
    """A .gguf file (a source, or a bake's output with its two sidecars)."""

    name = "gguf"
    offered = "a .gguf file"

    @classmethod
    def holds(cls, path: str | Path) -> bool:
        # by the suffix, as every command reads MODEL; the header is checked when it is opened
        return is_gguf(path) and not Path(path).expanduser().is_dir()

    def refuse(self, options: Any) -> None:
        return None  # verify and allow_zero are moot: every edited block is checked exact or refused

    def open(self, load: Any) -> Opened:
        from ..gguf.model import open_gguf
        from ..model.loading import Source

        model = open_gguf(self.path)
        return Opened(model, model.config, Source(self.path))

    def outputs(self, out: Path, labels: Sequence[str]) -> dict[str, Path]:
        return sweep_outputs(out, labels)

    def check_free(self, dest: Path, protected: Sequence[Path], force: bool) -> None:
        from ..core.destinations import check_free_file
        from .gguf import check_gguf_name, replaceable

        check_gguf_name(dest)
        check_free_file(dest, protected, force, replaceable)

    def prepare(self, opened: Opened, recipes: Sequence[Any], labels: Sequence[str], options: Any) -> list[Any]:
        from .gguf import prepare

        prepared = []
        for label, recipe in zip(labels, recipes, strict=True):
            try:
                prepared.append(prepare(opened.model, recipe, options.requantize))
            except RecipeError as exc:  # say which value cannot be baked
                raise RecipeError(f"{label}: {exc}") from None
        return prepared

    def bake(self, opened: Opened, recipe: Any, out: Path, call: BakeCall) -> BakeResult:
        # every edited block is checked as it is computed (``verify`` has nothing to add), and a
        # file has no folder to write a card into: its card is rendered when it is pushed
        from .gguf import bake_gguf

        o = call.options
        return bake_gguf(
            opened.model, recipe, out, source=opened.source, force=o.force, requantize=o.requantize,
            extra=call.extra, report=call.report, progress=call.stages, prepared=call.prepared,
        )  # fmt: skip

    def verify(self, source: str | Path, *, structural_only: bool, load: Any, progress: StageProgress) -> Any:
        from .gguf_verify import verify_gguf

        return verify_gguf(self.path, source, progress=progress)

    def undo(self, out: str | Path, force: bool, report: Callable[[str], None]) -> dict[str, str]:
        from .gguf_verify import undo_gguf

        return undo_gguf(self.path, out, force, report=report)

    def check_pushable(self) -> tuple[str, Any]:
        from .gguf_verify import checked_gguf
        from .pushable import check_pushable

        if not self.path.is_file():  # no bake here: the refusal names what a push takes
            return check_pushable(self.path)
        return checked_gguf(self.path)

    def uploads(self) -> dict[str, Path] | None:
        from .provenance import sidecars

        return {self.path.name: self.path, **{p.name: p for p in sidecars(self.path)}}

    def card(self, record: Any) -> str:
        from .gguf_card import gguf_card

        return gguf_card(self.path, record)

    def recorded_weights(self) -> dict[str, str] | None:
        return None  # its card is rendered from the sidecar record alone: no eval result reaches it
