"""The declared interface of a stored format, and the registry that ``Checkpoint.format`` reads.

A stored format is how a checkpoint's weights are stored: plain floats, FP8 e4m3 bytes with float
scales, integer codes with scales and zero points. One subclass of :class:`StoredFormat` per format
says, in one place, how to recognise it from the config's ``quantization_config`` (:meth:`detect`),
how an edit becomes exact byte patches or a one-line refusal (:meth:`plan`), how a bake's output is
checked with the format's own decoder (:meth:`check`), and how finders, eval and verify load it
(:meth:`layerwise_dtype`, :meth:`load`). A subclass that sets ``name`` registers itself.

The base lives here because :class:`~surgery.core.checkpoint.Checkpoint` answers with a format and
core imports nothing above it; the formats themselves live in ``surgery/formats/`` (they run the
byte plan of ``surgery/bake/`` and the loaders of ``surgery/model/``), and ``import surgery``
registers them. ``docs/contributing/adding-a-format.md`` adds one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from .errors import SurgeryError
from .registry import register

_REGISTRY: dict[str, type[StoredFormat]] = {}


class StoredFormat(ABC):
    """How a checkpoint's weights are stored; an instance carries what its config says (its scheme)."""

    name: ClassVar[str]  # the registry key; a subclass that sets it registers itself
    offered: ClassVar[str]  # the format as the refusal of an unknown quantization offers it ("an FP8 e4m3")
    quantized: ClassVar[bool] = True  # whether the weights are codes that surgery edits through their scales
    fallback: ClassVar[bool] = False  # the format of a checkpoint no other format detects (plain floats)
    # Stored dtypes beyond F32 / F16 / BF16 whose tensors the plan edits (exactly, or refused in one line)
    edited_dtypes: ClassVar[frozenset[str]] = frozenset()
    # Whether bake/guards.py reads the edited floats' peaks: False where every edit is exact or refused
    guarded: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register(_REGISTRY, cls, "stored formats")

    # --- recognising it ---------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def detect(cls, qconfig: Any) -> StoredFormat | None:
        """The format a ``quantization_config`` value describes, or None when it is not this one."""

    @classmethod
    def refusal(cls, qconfig: Any) -> str | None:
        """What ``{path} holds`` when ``qconfig`` is this format's but in a variant surgery does not edit
        (a clause naming the field and what to do), or None."""
        return None

    def describe(self) -> str:
        """The weights' layout in words, for messages."""
        return self.name

    # --- baking ---------------------------------------------------------------------------------
    def view(self, ckpt: Any) -> Any:
        """``ckpt`` as the byte planner reads it: each edited weight under its plain name ``X.weight`` at
        its logical shape (where the stored tensors are named or shaped otherwise)."""
        return ckpt

    @abstractmethod
    def plan(self, ckpt: Any, arch: Any, edits: Iterable[Any]) -> list:
        """The byte patches (``surgery.core.patches.TensorPatch``) of ``edits`` on ``ckpt``, each exact,
        or a one-line ``RecipeError`` / ``CheckpointError`` naming the tensor and why."""

    @abstractmethod
    def check(self, src: Any, out: Any, recipe: Any) -> tuple[int, list[str]]:
        """(tensors compared, problem lines) of the bake of ``recipe`` from ``src`` into ``out``, by this
        format's own decoder: every edited weight of ``out`` must be the recipe's scales times ``src``'s."""

    @property
    def check_reads(self) -> str:
        """What :meth:`check` decodes, as the bake's record names it ("e4m3 weights")."""
        return f"{self.describe()} weights"

    # --- loading for computation ------------------------------------------------------------------
    @abstractmethod
    def layerwise_dtype(self, ckpt: Any, config: Any) -> Any:
        """The 16-bit torch dtype to hold ``ckpt``'s weights (transformers ``config``) in for float32
        compute a layer at a time (model/upcast.py), or None to load them whole in the compute dtype."""

    def load(self, ckpt: Any, config: Any, held: bool, from_pretrained: Callable[..., Any]) -> Any:
        """The model of ``ckpt`` (transformers ``config``) with the weights a bake edits, from
        ``from_pretrained(**arguments)``; ``held``: loaded in :meth:`layerwise_dtype`, each layer's
        weights made float32 only for its call."""
        return from_pretrained()

    @property
    def loads_dequantized(self) -> bool:
        """Whether a load gives the model the weights' exact values in its compute dtype (no codes run), so
        verify's tolerance takes no storage rounding."""
        return False


def registered() -> list[type[StoredFormat]]:
    """Every registered format, in the order of registration."""
    return list(_REGISTRY.values())


def detect(configs: Iterable[Mapping[str, Any]]) -> StoredFormat:
    """The format of a checkpoint whose config (and text config) are ``configs``: the first registered
    format that detects one's ``quantization_config``, else the fallback (plain floats)."""
    configs = list(configs)
    for cls in registered():
        if cls.fallback:
            continue
        for cfg in configs:
            if found := cls.detect(cfg.get("quantization_config")):
                return found
    fallbacks = [cls for cls in registered() if cls.fallback]
    if not fallbacks:
        raise SurgeryError("no stored format is registered: import surgery (not only surgery.core) first")
    return fallbacks[0]()


def known(qconfig: Any) -> bool:
    """Whether a registered format edits the weights ``qconfig`` describes."""
    return any(cls.detect(qconfig) for cls in registered() if not cls.fallback)


def refusal(qconfig: Any) -> str | None:
    """The first registered format's :meth:`StoredFormat.refusal` of ``qconfig``, or None."""
    return next((why for cls in registered() if (why := cls.refusal(qconfig))), None)


def offered() -> str:
    """The formats surgery edits, as a refusal offers them: "A, B or C"."""
    names = [cls.offered for cls in registered()]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
