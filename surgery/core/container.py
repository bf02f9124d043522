"""The declared interface of a container, and :func:`open_container`, which picks one for a path.

A container is what holds a model's weights on disk: a safetensors folder (with surgery.json,
surgery.undo and README.md beside the weights once baked), or a GGUF file (with its two sidecars).
One subclass of :class:`Container` per kind says, in one place, whether a path names it
(:meth:`Container.holds`), how a recipe is checked and baked into it, where a sweep's values go,
how a bake's output is verified, undone and checked before a push, which files a push uploads,
and how its card is rendered.
A subclass that sets ``name`` registers itself; :func:`open_container` decides once, and the bake,
sweep, verify, undo and push are then one path for every container (surgery/api/baking.py,
surgery/api/checkpoints.py, surgery/ship/hub.py).

The base lives here because core imports nothing above it; the containers themselves run the bake
(``surgery/bake/folder_container.py``, ``surgery/bake/gguf_container.py``), and ``import surgery``
registers them. The methods take the caller's policy objects (``BakeOptions``, ``LoadSpec``) as
they are: core does not know their types.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .errors import CheckpointError, SurgeryError, require_model_path
from .progress import StageProgress, silent_stages
from .registry import register

_REGISTRY: dict[str, type[Container]] = {}


@dataclass(frozen=True)
class Opened:
    """A container opened for a bake: the model as its bake reads it, its config, and its Source."""

    model: Any
    config: dict[str, Any]
    source: Any  # surgery.model.loading.Source


def _ignore(message: str) -> None:
    return None


@dataclass(frozen=True)
class BakeCall:
    """What one bake into a container is told beyond its recipe and destination."""

    options: Any  # the caller's BakeOptions (force, verify, allow_zero, requantize …)
    load: Any  # the caller's LoadSpec
    extra: dict[str, Any] | None = None  # entries added to the record
    card: Callable[[Path, Any], str] | None = None  # the card hook (staged output, record) → README.md
    stages: StageProgress = silent_stages
    report: Callable[[str], None] = _ignore  # the bake's notes
    noted: Callable[[str], None] = _ignore  # notes kept with the lineage note (before the bake's own)
    prepared: Any = None  # what :meth:`Container.prepare` computed for this value, or None


class Container(ABC):
    """A model's weights on disk (a source, or a bake's output) and what the bake pipeline does with them."""

    name: ClassVar[str]  # the registry key; a subclass that sets it registers itself
    offered: ClassVar[str]  # the container as a refusal offers it ("a .gguf file")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register(_REGISTRY, cls, "containers")

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.given = str(path)  # as the caller wrote it: a Hub id is not a local path

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.given!r})"

    # --- recognising it ---------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def holds(cls, path: str | Path) -> bool:
        """Whether ``path`` names this container, from its name and whether it is a file or a folder
        (no file is read: opening it checks its content)."""

    # --- baking into a copy -----------------------------------------------------------------------
    @abstractmethod
    def refuse(self, options: Any) -> None:
        """Refuse, in one line, a bake option (``BakeOptions``) that does not apply to this container."""

    @abstractmethod
    def open(self, load: Any) -> Opened:
        """This source opened for a bake (``load``: a ``LoadSpec``)."""

    @abstractmethod
    def outputs(self, out: Path, labels: Sequence[str]) -> dict[str, Path]:
        """Where each value of a sweep into ``out`` goes, by label."""

    @abstractmethod
    def check_free(self, dest: Path, protected: Sequence[Path], force: bool) -> None:
        """Refuse ``dest`` as an output (taken, or inside ``protected``) before anything is written."""

    def check_out(self, dest: Path, protected: Sequence[Path], force: bool) -> None:
        """Refuse ``dest`` as the output of one bake before anything is written: :meth:`check_free`,
        and the folder it goes into must exist and be writable (as the bake's own staged write checks)."""
        from .destinations import check_parent

        self.check_free(dest, protected, force)
        check_parent(dest)

    @abstractmethod
    def prepare(self, opened: Opened, recipes: Sequence[Any], labels: Sequence[str], options: Any) -> list[Any]:
        """Check every value of a sweep (its recipe, after lineage) before the first is written: a
        refusal names its label. Returns what :meth:`bake` takes as ``prepared``, one per value."""

    @abstractmethod
    def bake(self, opened: Opened, recipe: Any, out: Path, call: BakeCall) -> Any:
        """Bake ``recipe`` into a copy of this source at ``out`` (written atomically); the ``BakeResult``."""

    # --- a bake's output --------------------------------------------------------------------------
    @abstractmethod
    def verify(self, source: str | Path, *, structural_only: bool, load: Any, progress: StageProgress) -> Any:
        """Check this bake's output against ``source``; the ``Report``."""

    @abstractmethod
    def undo(self, out: str | Path, force: bool, report: Callable[[str], None]) -> dict[str, str]:
        """Restore this bake's source at ``out``; {file name: sha256} of what was written."""

    @abstractmethod
    def check_pushable(self) -> tuple[str, Any]:
        """Refuse an output that is not a verified surgery output; (how it was checked, its record)."""

    @abstractmethod
    def uploads(self) -> dict[str, Path] | None:
        """What a push uploads, by name in the repo, besides a card rendered from the record; None: the
        folder as it is (its card was written beside the weights at bake time)."""

    @abstractmethod
    def card(self, record: Any) -> str:
        """This bake output's model card (README.md text), rendered from its ``record`` (a ``BakeRecord``)."""

    @abstractmethod
    def recorded_weights(self) -> dict[str, str] | None:
        """The sha256 of this bake output's weight files as its record holds them (what an eval result
        names the model it measured by, so that a card takes only its own numbers); None when no
        card can take an eval result here."""


def registered() -> list[type[Container]]:
    """Every registered container, in the order of registration."""
    return list(_REGISTRY.values())


def container_class(path: str | Path) -> type[Container] | None:
    """The registered container that holds ``path``, or None."""
    if not _REGISTRY:
        raise SurgeryError("no container is registered: import surgery (not only surgery.core) first")
    return next((cls for cls in registered() if cls.holds(path)), None)


def open_container(path: str | Path) -> Container:
    """The container ``path`` names, decided once; a path no container holds is refused in one line."""
    require_model_path(path)
    cls = container_class(path)
    if cls is None:
        names = [c.offered for c in registered()]
        offered = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        raise CheckpointError(f"{path} is a file; give {offered}")
    return cls(path)
