"""What ``surgery.inspect``, ``surgery.evaluate`` and ``surgery.export_lora`` return: frozen records
read by attribute, whose ``to_dict()`` is the JSON the command line prints (``inspect --json``,
``eval --json``, ``export-lora --json``) key for key. (``surgery.push`` returns the bake record's
``Pushed``, whose ``to_dict()`` is ``push --json``.)

These functions returned that dict before; reading a result by key (``info["layers"]``) still works
for one release, with a DeprecationWarning naming the attribute to read instead.
"""

from __future__ import annotations

import warnings
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..bake.record import AdapterRecord


def _plain(value: Any) -> Any:
    """A field's JSON value: a record's dict, a tuple's list."""
    if isinstance(value, ApiResult):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


class ApiResult:
    """A returned record: ``to_dict()`` gives its JSON object, keys in field order; a field with a
    default is left out while None (one without a default is written even then)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object the command line prints for this result."""
        return {
            f.name: _plain(value)
            for f in fields(self)  # type: ignore[arg-type]  (subclasses are dataclasses)
            if (value := getattr(self, f.name)) is not None or f.default is MISSING
        }

    def __getitem__(self, key: str) -> Any:
        """The old dict access, kept for one release."""
        warnings.warn(
            f"reading {type(self).__name__} by key ([{key!r}]) is deprecated and will be removed in the next "
            f"release; read the attribute .{key} (or .to_dict()[{key!r}])",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.to_dict()[key]


@dataclass(frozen=True, kw_only=True)
class Inspection(ApiResult):
    """What a model is and what surgery may edit in it (``surgery.inspect``). A model surgery does not
    edit has ``supported`` False and ``refused`` (the one-line reason), and no sizes."""

    path: str
    model_type: str | None
    supported: bool
    refused: str | None = None
    layers: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    hidden_size: int | None = None
    mlp_width: int | None = None
    dtypes: tuple[str, ...]
    shards: int
    tensors: int
    bytes: int
    layer_prefix: str | None = None
    # mixture of experts: neurons are named L:eE:N (routed), L:s:N (shared)
    experts: int | None = None
    expert_width: int | None = None
    expert_layers: str | None = None  # "K of N"
    expert_layout: str | None = None  # "fused 3-D" or "one tensor per expert"
    shared_expert_width: int | None = None
    mla: dict[str, Any] | None = None  # multi-head latent attention sizes
    o_groups: int | None = None  # DeepSeek-V4's output groups and their rank
    o_lora_rank: int | None = None
    # per kind of layer: its layers, what an edit may touch, and a one-line summary
    layer_kinds: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True, kw_only=True)
class Measured(ApiResult):
    """A model an evaluation measured: its path, fingerprint, and for a bake the sha256 of its weight
    files; ``from_cache`` (the source compared against): whether its results came from the cache."""

    path: str
    fingerprint: str
    weights_sha256: Any
    from_cache: bool | None = None


@dataclass(frozen=True, kw_only=True)
class Sides(ApiResult):
    """One entry per metric, for the evaluated model and for the source it was compared against."""

    model: dict[str, Any]
    against: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class EvalResult(ApiResult):
    """What ``surgery.evaluate`` measured (``to_dict()``: the result JSON, as ``eval --out`` writes it)."""

    format: str
    version: int
    tool_version: str
    created: str
    model: Measured
    against: Measured | None
    settings: dict[str, Any]
    metrics: Sides
    retained_pct: dict[str, float]
    details: Sides
    seconds: float

    @classmethod
    def of(cls, result: dict[str, Any]) -> EvalResult:
        """The record of an evaluation's result JSON (surgery.evaluation.suites.evaluate)."""
        against = result["against"]
        return cls(
            **{k: result[k] for k in ("format", "version", "tool_version", "created", "settings", "retained_pct")},
            model=Measured(**result["model"]),
            against=Measured(**against) if against is not None else None,
            metrics=Sides(**result["metrics"]),
            details=Sides(**result["details"]),
            seconds=result["seconds"],
        )


@dataclass(frozen=True)
class ExportedLora:
    """A LoRA adapter ``surgery.export_lora`` wrote: the folder and its record (surgery_adapter.json).

    Reading a record's field on this result (``.modules``) still works for one release, with a
    DeprecationWarning naming ``.adapter.modules``.
    """

    out: str
    adapter: AdapterRecord

    def to_dict(self) -> dict[str, Any]:
        """The JSON ``export-lora --json`` prints: the folder, then the adapter record."""
        return {"out": self.out, **self.adapter.to_dict()}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("out", "adapter"):  # not set yet (copying) or private
            raise AttributeError(name)
        value = getattr(self.adapter, name)
        warnings.warn(
            f"export_lora returns an ExportedLora; reading .{name} on it is deprecated and will be removed in "
            f"the next release: read .adapter.{name}",
            DeprecationWarning,
            stacklevel=2,
        )
        return value
