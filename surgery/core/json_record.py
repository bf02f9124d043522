"""Typed JSON files: one dataclass per JSON object, read and written back key for key.

surgery.json, surgery_adapter.json and the findings files are versioned JSON that older releases of
surgery wrote, that caches are keyed by, and that other tools read. Each object in them is a
:class:`JsonRecord`: a dataclass whose fields are the object's keys. ``from_dict`` reads a parsed
object (its parts into their own record classes, keys the class does not declare into ``extra``, in
order); ``to_dict`` gives the object back with the same keys in the same order. So a file read and
written again is unchanged, and a record built in code is laid out as surgery always wrote it.
The rest of the package reads these files through the records' attributes only
(tests/core/test_typed_files.py keeps string-keyed reads of them out of other modules).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from .errors import SurgeryError

R = TypeVar("R", bound="JsonRecord")
_MISSING = dataclasses.MISSING
_OWN = ("extra", "layout")  # the fields of JsonRecord itself: not keys of the object


class Malformed(SurgeryError):
    """A JSON object does not have the shape its record declares (``at``: the key path)."""

    def __init__(self, at: str, what: str) -> None:
        super().__init__(f"'{at}' {what}" if at else what)
        self.at, self.what = at, what


@dataclass(frozen=True)
class Codec:
    """How one key's JSON value becomes a field's value (``load(raw, at)``) and back (``dump``)."""

    load: Callable[[Any, str], Any]
    dump: Callable[[Any], Any]


PLAIN = Codec(lambda raw, at: raw, lambda value: value)


def checked(kind: type, what: str) -> Codec:
    """A plain JSON value that must be of ``kind`` (``what`` says so in the error)."""

    def load(raw: Any, at: str) -> Any:
        if not isinstance(raw, kind) or (isinstance(raw, bool) and kind is not bool):  # True is an int too
            raise Malformed(at, f"must be {what}, got {type(raw).__name__}")
        return raw

    return Codec(load, lambda value: value)


TEXT = checked(str, "a string")
INTEGER = checked(int, "an integer")


def part(cls: type[R]) -> Codec:
    """A nested object read into the record class ``cls``."""
    return Codec(cls.read, lambda value: value.to_dict())


def listof(codec: Codec) -> Codec:
    """A JSON list whose items each go through ``codec``."""

    def load(raw: Any, at: str) -> list:
        if not isinstance(raw, list):
            raise Malformed(at, f"must be a list, got {type(raw).__name__}")
        return [codec.load(item, f"{at}[{i}]") for i, item in enumerate(raw)]

    return Codec(load, lambda values: [codec.dump(v) for v in values])


def mapof(codec: Codec) -> Codec:
    """A JSON object of any keys whose values each go through ``codec``."""

    def load(raw: Any, at: str) -> dict:
        if not isinstance(raw, Mapping):
            raise Malformed(at, f"must be a JSON object, got {type(raw).__name__}")
        return {k: codec.load(v, f"{at}.{k}") for k, v in raw.items()}

    return Codec(load, lambda values: {k: codec.dump(v) for k, v in values.items()})


def entry(key: str | None = None, *, codec: Codec = PLAIN, default: Any = _MISSING, keep_none: bool = False) -> Any:
    """A record field whose JSON key differs from its name (``key``), whose value goes through
    ``codec``, or that is written even while None (``keep_none``; an optional field is left out
    then). A field without ``entry`` is the key of its own name, its value as is."""
    return field(default=default, metadata={"json": (key, codec, keep_none)})


@dataclass(frozen=True)
class _Spec:
    name: str
    key: str
    codec: Codec
    required: bool
    keep_none: bool
    default: Any  # dataclasses.MISSING for a required key


@functools.cache
def _specs_of(cls: type) -> tuple[_Spec, ...]:
    """The key of every field of the record class ``cls``, in field order."""
    specs = []
    for f in dataclasses.fields(cls):
        if f.name in _OWN:
            continue
        key, codec, keep_none = f.metadata.get("json", (None, PLAIN, False))
        required = f.default is _MISSING and f.default_factory is _MISSING
        specs.append(_Spec(f.name, key or f.name, codec, required, keep_none, f.default))
    return tuple(specs)


@dataclass
class JsonRecord:
    """Base class of a JSON object's record; subclasses are dataclasses whose fields are its keys.

    A field with a default (None for an optional key) may be absent: a record built in code leaves
    out its optional keys while None; a record read writes the keys it was read with, and those
    set since to another value than the default. ``extra`` holds the keys the class does not
    declare (a command's own entries, newer fields), in order; ``layout`` the key order of the
    object read (None: built in code), which ``to_dict`` keeps; keys set since follow in the
    class's order.
    """

    extra: dict[str, Any] = field(default_factory=dict, kw_only=True)
    layout: tuple[str, ...] | None = field(default=None, kw_only=True, compare=False, repr=False)

    # The order of a new object's keys when it is not the fields' order.
    KEY_ORDER: ClassVar[tuple[str, ...]] = ()
    # The key after which a new object's ``extra`` entries go (None: at the end).
    EXTRA_AFTER: ClassVar[str | None] = None
    # How errors name the file, what they raise, and what they tell the user to do.
    LABEL: ClassVar[str] = "the JSON file"
    ERROR: ClassVar[type[SurgeryError]] = SurgeryError
    FIX: ClassVar[str] = "give a file written by surgery"

    @classmethod
    def read(cls: type[R], raw: Any, at: str = "") -> R:
        """The record of the parsed object ``raw`` at key path ``at``; raises :class:`Malformed`."""
        if not isinstance(raw, Mapping):
            raise Malformed(at, f"must be a JSON object, got {type(raw).__name__}")
        values: dict[str, Any] = {}
        specs = _specs_of(cls)
        for s in specs:
            where = f"{at}.{s.key}" if at else s.key
            if s.key not in raw:
                if s.required:
                    raise Malformed(where, "is missing")
            elif raw[s.key] is None and not (s.required and s.codec is not PLAIN):
                values[s.name] = None
            else:
                values[s.name] = s.codec.load(raw[s.key], where)
        declared = {s.key for s in specs}
        return cls(**values, extra={k: v for k, v in raw.items() if k not in declared}, layout=tuple(raw))

    @classmethod
    def from_dict(cls: type[R], raw: Any, where: str | None = None) -> R:
        """The record of the parsed object ``raw``; a malformed one raises ``ERROR`` in one line
        naming ``where`` (default ``LABEL``), the key and what to do."""
        try:
            return cls.read(raw)
        except Malformed as exc:
            raise cls.ERROR(f"{where or cls.LABEL}: {exc}; {cls.FIX}") from None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: the keys of the object read, in its order, then any set since, in the
        class's order (a record built in code: all of them in the class's order)."""
        specs = _specs_of(type(self))
        declared = [s.key for s in specs]
        clash = sorted(set(self.extra) & set(declared))
        if clash:
            raise ValueError(f"{type(self).__name__}: extra entries {clash} clash with its own keys")
        values: dict[str, Any] = {}
        for s in specs:
            value = getattr(self, s.name)
            if self.layout is None:  # built in code
                written = s.required or s.keep_none or value is not None
            else:  # read: the keys it had, and any set since
                written = s.key in self.layout or s.required or value != s.default
            if written:
                values[s.key] = None if value is None else s.codec.dump(value)
        values.update(self.extra)
        order = list(self.KEY_ORDER) + [k for k in declared if k not in self.KEY_ORDER]
        after = order.index(self.EXTRA_AFTER) + 1 if self.EXTRA_AFTER else len(order)
        order[after:after] = list(self.extra)
        layout = self.layout or ()
        keys = [k for k in layout if k in values] + [k for k in order if k not in layout and k in values]
        return {k: values[k] for k in keys}
