"""A safetensors checkpoint folder (or a Hub id) as a container: the bake copies it into a folder with
surgery.json, surgery.undo and its card beside the weights (surgery/bake/bake.py), verify compares
it with its source (surgery/bake/verify.py), undo restores the source's files (surgery/bake/undo.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.container import BakeCall, Container, Opened
from ..core.errors import DestinationError, ParameterError
from ..core.progress import StageProgress
from ..gguf import is_gguf

if TYPE_CHECKING:
    from .bake import BakeResult


def _refuse_gguf_name(dest: Path) -> None:
    """A folder bakes into a folder: one named .gguf would look like the GGUF file surgery does not make
    from a folder (a GGUF bake's output is the GGUF source, edited)."""
    if is_gguf(dest):
        raise DestinationError(
            f"--out {dest} ends in .gguf, but MODEL is a checkpoint folder, which bakes into a folder: name "
            "the output folder otherwise (a .gguf output comes from baking a GGUF file)"
        )


class FolderContainer(Container):
    """A checkpoint folder, or a Hub id (downloaded when opened)."""

    name = "folder"
    offered = "the checkpoint folder that holds it"

    @classmethod
    def holds(cls, path: str | Path) -> bool:
        # a path that does not exist is a Hub id, or a missing folder that opening refuses in its words
        local = Path(path).expanduser()
        return local.is_dir() or (not local.exists() and not is_gguf(path))

    def refuse(self, options: Any) -> None:
        if options.requantize:
            raise ParameterError(
                "{requantize} applies to GGUF models only (a checkpoint folder's bake rounds float weights to "
                "their dtype once, and refuses an edit its quantized weights cannot hold exactly); drop it",
                "requantize",
            )

    def open(self, load: Any) -> Opened:
        from ..model.loading import open_checkpoint

        ckpt, source = open_checkpoint(self.given, load)
        return Opened(ckpt, ckpt.config, source)

    def outputs(self, out: Path, labels: Sequence[str]) -> dict[str, Path]:
        _refuse_gguf_name(out)  # the sweep's folder
        return {label: out / label for label in labels}

    def check_free(self, dest: Path, protected: Sequence[Path], force: bool) -> None:
        from ..core.destinations import check_free  # on use: `import surgery` registers this class without YAML

        _refuse_gguf_name(dest)
        check_free(dest, protected, force)

    def prepare(self, opened: Opened, recipes: Sequence[Any], labels: Sequence[str], options: Any) -> list[Any]:
        from .guards import check_scales

        check_scales(opened.model, list(recipes), allow_zero=options.allow_zero)
        return [None] * len(recipes)  # the bake plans each value itself

    def bake(self, opened: Opened, recipe: Any, out: Path, call: BakeCall) -> BakeResult:
        from .bake import bake
        from .check import edited_check
        from .runnable import runs_alongside

        _refuse_gguf_name(out)
        ckpt, verify = opened.model, call.options.verify
        return bake(
            ckpt,
            recipe,
            out,
            source=opened.source,
            force=call.options.force,
            progress=call.stages,
            check=edited_check(ckpt, recipe) if verify else None,
            alongside=runs_alongside(ckpt, call.load, call.noted) if verify else None,
            extra=call.extra,
            card=call.card,
            report=call.report,
            allow_zero=call.options.allow_zero,
        )

    def verify(self, source: str | Path, *, structural_only: bool, load: Any, progress: StageProgress) -> Any:
        from ..model.loading import open_checkpoint
        from .verify import verify

        ckpt, _ = open_checkpoint(source, load)
        return verify(ckpt, self.path, run_model=not structural_only, load=load, progress=progress)

    def undo(self, out: str | Path, force: bool, report: Callable[[str], None]) -> dict[str, str]:
        from .undo import undo

        return undo(self.path, out, force, report=report)

    def check_pushable(self) -> tuple[str, Any]:
        from .pushable import check_pushable

        return check_pushable(self.path)

    def uploads(self) -> dict[str, Path] | None:
        return None  # the folder as it is: its card was written beside the weights

    def card(self, record: Any) -> str:
        from .card import folder_card

        return folder_card(self.path, record)

    def recorded_weights(self) -> dict[str, str] | None:
        from .provenance import baked_weights

        return baked_weights(self.path)
