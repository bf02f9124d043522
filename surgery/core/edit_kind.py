"""The registry of edit kinds: one class per kind of edit, registered once, read everywhere.

An edit kind is a frozen dataclass deriving from :class:`Edit` and decorated with
:func:`register_edit_kind`. Its class says, in one place, everything the rest of surgery needs:

* **recipe keys**: its dataclass fields, each declared with :func:`recipe_key` and a parser
  (:func:`index`, :func:`number`, or the kind's own); ``type: <kind>`` selects the class, and
  :meth:`Edit.from_dict` / :meth:`Edit.to_dict` read and write the entry with strict checks;
* **validation** against a model's architecture (:meth:`Edit.validate`);
* **sites** (:meth:`Edit.sites`): the weight columns and rows it scales (surgery/core/sites.py). The
  run-time twin (model/hooks.py), the byte plan (core/patches.py), the bake's check, verify and the
  LoRA export all derive from the sites, so a kind whose sites are column or row scales needs
  nothing else;
* **LoRA support** (:meth:`Edit.lora_refusal`) and **card text** (:meth:`Edit.card_row`,
  :meth:`Edit.card_tags`).

The built-in kinds are ``head`` (surgery/core/head_edit.py), ``neuron``
(surgery/core/neuron_edit.py), ``direction`` and ``steer`` (surgery/core/direction_edit.py, whose
sites are projections and bias additions, not scales); ``docs/contributing/adding-an-edit-kind.md`` adds one, step by step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any, ClassVar

from .counted import in_number
from .errors import RecipeError
from .strict_files import number_trap

if TYPE_CHECKING:
    from .architectures import Architecture
    from .sites import Site

FLOAT32_MAX = 3.4028234663852886e38

Parser = Callable[[Any, str], Any]


def index(value: Any, where: str) -> int:
    """A recipe value that must be an integer ≥ 0 (a layer, head, neuron or expert index; numpy's
    integers too)."""
    _check_real(value, where)
    if not isinstance(value, Integral):
        raise RecipeError(f"{where} must be an integer, got {value!r}")
    if value < 0:
        raise RecipeError(f"{where} must be ≥ 0, got {value}")
    return int(value)


def number(value: Any, where: str) -> float:
    """A recipe value that must be a finite number (a scale)."""
    named = isinstance(value, str) and value.lower().lstrip("+-.") in ("nan", "inf", "infinity")
    if not named:
        _check_real(value, where)
    if named or not math.isfinite(value):
        raise RecipeError(
            f"{where} must be a finite number, got {value!r}: a NaN or infinite scale would make the "
            "edited weights NaN or inf"
        )
    return float(value)


def _check_real(value: Any, where: str) -> None:
    """``value`` is a number (numpy's too): not a boolean, not text (saying why text that looks like one is not)."""
    if isinstance(value, bool):
        raise RecipeError(f"{where} must be a number, got {value!r} (a boolean)")
    if isinstance(value, Real):
        return
    trap = number_trap(value)
    if trap:
        raise RecipeError(f"{where} = {value!r} is not a plain decimal number: {trap}")
    raise RecipeError(f"{where} must be a number, got {value!r}")


def recipe_key(parse: Parser, **kwargs: Any) -> Any:
    """A dataclass field that is also a recipe key, read with ``parse(value, where)``; give
    ``default=`` for an optional key (left out of the recipe when it holds its default)."""
    return dataclasses.field(metadata={"recipe": parse}, **kwargs)


def check_layer(arch: Architecture, layer: int, where: str) -> None:
    """``layer`` is a decoder layer of ``arch``."""
    n, key = arch.geometry.num_layers, arch.layout.config.keys.num_hidden_layers
    if layer >= n:
        raise RecipeError(f"{where}.layer = {layer} but the model has {key} = {n} (valid: 0..{n - 1})")


def layer_list(layers: tuple[int, ...] | list[int], most: int = 8) -> str:
    """Layer indices for a message: ``3, 7, 11`` (the first ``most``, then how many more)."""
    shown = ", ".join(map(str, layers[:most]))
    return shown + (f" and {len(layers) - most} more" if len(layers) > most else "") if layers else "none"


def check_scale(scale: float, where: str) -> None:
    """Weights are at most float32: a larger scale turns into inf (and crashes the run-time twin)."""
    if not (math.isfinite(scale) and abs(scale) <= FLOAT32_MAX):
        raise RecipeError(
            f"{where}: scale {scale!r} is not a finite float32 number "
            f"(|scale| ≤ {FLOAT32_MAX:.3g}); choose a smaller value"
        )


class Edit:
    """Base class of every edit kind (a frozen dataclass registered with :func:`register_edit_kind`)."""

    kind: ClassVar[str]  # the recipe's ``type``
    scale_key: ClassVar[str] = "scale"  # how messages name the scale of its sites ("alpha")
    keys: ClassVar[tuple[str, ...] | None] = None  # recipe key order when it differs from the fields'

    def __post_init__(self) -> None:
        # numpy's numbers (a layer picked with np.argmax) become Python's: recipes, JSON records and
        # cards write the edit's values, and equal edits must compare and hash equal.
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or type(value) in (int, float):
                continue
            if isinstance(value, Integral):
                object.__setattr__(self, f.name, int(value))
            elif isinstance(value, Real):
                object.__setattr__(self, f.name, float(value))

    # --- the recipe entry -------------------------------------------------------------------------

    @classmethod
    def recipe_keys(cls) -> tuple[str, ...]:
        """Every recipe key of this kind, in the order a recipe writes them."""
        return cls.keys or tuple(f.name for f in dataclasses.fields(cls) if "recipe" in f.metadata)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str, vectors: Any = None) -> Edit:
        """Parse one recipe entry of this kind: unknown and missing keys named, each value checked.
        ``vectors`` reads the files a kind's entries name (surgery.core.vectors; direction edits)."""
        fields = {f.name: f for f in dataclasses.fields(cls) if "recipe" in f.metadata}
        keys = cls.recipe_keys()
        required = [k for k in keys if fields[k].default is dataclasses.MISSING]
        unknown = sorted(set(raw) - set(keys) - {"type"}, key=str)
        if unknown:
            raise RecipeError(
                f"{where}: unknown {in_number(len(unknown), 'key')} {', '.join(map(str, unknown))} (allowed: type, {', '.join(keys)})"
            )
        missing = [k for k in required if k not in raw]
        if missing:
            raise RecipeError(f"{where}: missing {in_number(len(missing), 'key')} {', '.join(missing)}")
        values = {
            k: fields[k].metadata["recipe"](raw[k], f"{where}.{k}")
            for k in keys
            if k in raw and not (raw[k] is None and k not in required)
        }
        return cls(**values)

    def check_values(self, where: str) -> None:
        """Every recipe key's value passes its parser (an edit built in Python, not read from a recipe)."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if "recipe" in f.metadata and not (value is None and f.default is None):
                f.metadata["recipe"](value, f"{where}.{f.name}")

    def to_dict(self) -> dict[str, Any]:
        """The recipe entry (optional keys left out while they hold their default)."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        out: dict[str, Any] = {"type": self.kind}
        for k in self.recipe_keys():
            value = getattr(self, k)
            if fields[k].default is dataclasses.MISSING or value != fields[k].default:
                out[k] = value
        return out

    # --- identity ---------------------------------------------------------------------------------

    @property
    def target(self) -> tuple:
        """What the edit acts on: two edits of one target with different settings conflict."""
        raise NotImplementedError

    @property
    def label(self) -> str:
        """The edit's target in the command line's notation (``7.7``, ``28:17``)."""
        raise NotImplementedError

    @property
    def setting(self) -> str:
        """The edit's setting in words (``α = 2.5``), for messages."""
        raise NotImplementedError

    def is_identity(self) -> bool:
        """True when the edit changes nothing (and has no sites)."""
        raise NotImplementedError

    # --- what it does to a model ------------------------------------------------------------------

    def validate(self, arch: Architecture, where: str) -> None:
        """Raise RecipeError (naming ``where`` and the config field) when ``arch`` has no such target."""
        raise NotImplementedError

    def sites(self, arch: Architecture) -> list[Site]:
        """Where the edit acts (none for an identity), in the order the bake checks and patches them."""
        raise NotImplementedError

    def lora_refusal(self, arch: Architecture) -> str | None:
        """Why the edit has no exact LoRA adapter, or None when its twin sites are the adapter."""
        return None

    # --- the model card ---------------------------------------------------------------------------

    def card_row(self, where: str) -> tuple[str, str, str, str, str]:
        """The card's table row (edit, layer, index, setting, effect); ``where`` names the weight
        entries it changes (from the sites)."""
        raise NotImplementedError

    def card_tags(self) -> tuple[str, ...]:
        """Hub tags the card gets for this edit."""
        return ()


_KINDS: dict[str, type[Edit]] = {}


def register_edit_kind(cls: type[Edit]) -> type[Edit]:
    """Register an edit kind (use as a class decorator); its ``kind`` becomes a recipe ``type``."""
    if not (isinstance(cls, type) and issubclass(cls, Edit) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"{cls!r}: an edit kind is a dataclass deriving from surgery.core.edit_kind.Edit")
    name = getattr(cls, "kind", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__name__} needs a class attribute kind = '<recipe type>'")
    if name in _KINDS and _KINDS[name] is not cls:
        raise ValueError(f"edit kind '{name}' is already registered ({_KINDS[name].__name__})")
    _KINDS[name] = cls
    return cls


def unregister_edit_kind(name: str) -> None:
    """Remove a registered kind (tests that register their own)."""
    _KINDS.pop(name, None)


def edit_kinds() -> dict[str, type[Edit]]:
    """The registered kinds by recipe ``type``."""
    return dict(_KINDS)


def edit_from_dict(raw: Any, where: str = "edit", vectors: Any = None) -> Edit:
    """Parse one recipe entry such as ``{type: head, layer: 7, head: 7, alpha: 2.5}``; ``vectors``
    reads the files it names (surgery.core.vectors)."""
    if not isinstance(raw, Mapping):
        raise RecipeError(f"{where} must be a mapping with a 'type', got {raw!r}")
    kind = raw.get("type")
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        names = sorted(_KINDS)
        raise RecipeError(f"{where}.type must be {' or '.join(repr(n) for n in names)}, got {kind!r}")
    return cls.from_dict(raw, where, vectors)


def edit_to_dict(edit: Edit) -> dict[str, Any]:
    """The recipe entry of ``edit``."""
    return edit.to_dict()
