"""Findings files: versioned JSON evidence computed once, cached, and reused for any α or n.

A findings file records what was found (per-head or per-neuron scores, per-layer directions)
together with the model it was found on (fingerprint + geometry), the dataset's sha256 and the
parameters, so that a later ``amplify-heads`` / ``prune-neurons`` / ``ablate-direction`` can check
it belongs to the model it is applied to. :class:`Findings` types that common head; each kind
types its results in a subclass (surgery.find.heads.record, surgery.find.neurons.record,
surgery.find.directions.record). Files written before still read: the
cache holds them, keyed by model, data and parameters, not by layout.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from ..core import finite_json
from ..core.architectures import architecture
from ..core.cache import cache_dir
from ..core.checkpoint import Checkpoint
from ..core.errors import FindingsError, SurgeryError
from ..core.json_record import TEXT, JsonRecord, Malformed, entry, part
from ..core.staging import atomic_write_text
from ..core.strict_files import DuplicateKey, load_json
from .finders import finder, kinds

FORMAT = "surgery-findings"
FINDINGS_VERSION = 1
F = TypeVar("F", bound="Findings")
FoundT = TypeVar("FoundT", bound="Found")


@dataclass(kw_only=True)
class ModelIdentity(JsonRecord):
    """The model findings were computed on (:func:`model_identity`); findings apply to the same
    weights (fingerprint), or with --transfer to the same architecture (model_type, geometry)."""

    fingerprint: str = entry(codec=TEXT)
    model_type: str | None = None
    geometry: dict[str, Any] | None = None
    path: str | None = None

    @classmethod
    def of(cls, ckpt: Checkpoint) -> ModelIdentity:
        arch = architecture(ckpt.config)
        return cls(
            fingerprint=ckpt.fingerprint(),
            model_type=arch.model_type,
            geometry=arch.geometry.to_dict(),
            path=str(ckpt.origin),
        )


@dataclass(kw_only=True)
class Compute(JsonRecord):
    """Where and in what precision a finder ran the model (:func:`compute_record`)."""

    dtype: str
    device: str
    device_map: str | None = None  # "accelerate" when the model was placed by a device map


@dataclass(kw_only=True)
class Findings(JsonRecord):
    """The common head of every findings file; a subclass per kind (``KIND``) types its results,
    and this class keeps them in ``extra``."""

    format: str = FORMAT
    version: int = FINDINGS_VERSION
    kind: str
    tool_version: str | None = None
    model: ModelIdentity = entry(codec=part(ModelIdentity))
    dataset_sha256: str | None = None
    parameters: dict[str, Any] | None = None
    compute: Compute | None = entry(codec=part(Compute), default=None)

    KIND: ClassVar[str] = ""
    LABEL = "findings file"
    ERROR = FindingsError

    @classmethod
    def from_dict(cls: type[F], raw: Any, where: str | None = None, kind: str | None = None) -> F:
        """The findings in ``raw``, checked: format, version, kind (a subclass's ``KIND``, else
        ``kind`` when given), the model; ``where`` names the file in errors."""
        where = where or cls.LABEL
        expected = cls.KIND or kind
        recorded = raw.get("kind") if isinstance(raw, Mapping) else None
        kind = expected or (recorded if recorded in kinds() else "heads")
        command = finder(kind).find_command  # the command that makes them
        if not isinstance(raw, Mapping) or raw.get("format") != FORMAT:
            raise FindingsError(
                f'{where} is not a surgery findings file (no "format": "{FORMAT}"); '
                f"give a file written by surgery {command}"
            )
        if raw.get("version") != FINDINGS_VERSION:
            raise FindingsError(
                f"{where} has findings version {raw.get('version')!r}; this surgery reads "
                f"version {FINDINGS_VERSION}: recompute it with surgery {command}"
            )
        if expected and recorded != expected:
            raise FindingsError(
                f"{where} holds {recorded!r} findings, but {kind} findings are needed (make them with surgery {command})"
            )
        if not isinstance(raw.get("model"), Mapping) or "fingerprint" not in raw["model"]:
            raise FindingsError(f"{where} does not record the model it was computed on; recompute it")
        try:
            return cls.read(raw)
        except Malformed as exc:
            raise FindingsError(f"{where}: {exc}; recompute it with surgery {command}") from None


def model_identity(ckpt: Checkpoint) -> dict[str, Any]:
    """What a findings file records about the model it was computed on (:meth:`ModelIdentity.of`)."""
    return ModelIdentity.of(ckpt).to_dict()


def newest_cached(found_type: type[FoundT], ckpt: Checkpoint) -> FoundT | None:
    """The most recently written sound cache entry of ``found_type``'s kind for ``ckpt``'s model key
    (any dataset and options), or None."""
    entries = (cache_dir() / found_type.kind).glob(f"{ckpt.model_key()[:16]}-*.json")
    for path in sorted(entries, key=lambda p: p.stat().st_mtime_ns, reverse=True):
        found = found_type.cached(path, ckpt)
        if found is not None:
            return found
    return None


def unchosen_findings(
    found_type: type[FoundT], ckpt: Checkpoint, work: str | None, note: Callable[[str], None]
) -> FoundT | None:
    """The rule of a baking command that finds when it must (amplify-heads, prune-neurons) when none
    of the options that decide the findings was given: the newest cached findings of this model
    (said in one line, with the file and its options), else None, after saying up front that the
    finder runs first with its default options and what that takes (``work``; None: the finder
    says it in its first line, as find-heads does, so it is not said twice)."""
    command = finder(found_type.kind).find_command
    found = newest_cached(found_type, ckpt)
    if found is not None:
        note(
            f"using the newest cached {command} findings for this model: {found.path} ({found.options()}); "
            f"give --findings FILE or {command} options to choose others"
        )
        return found
    work = work or f"{command} says what that takes as it starts"
    note(
        f"no {command} findings are cached for this model: running {command} with its default options first "
        f"({work}); interrupt it and run {command} with the options you want, then bake again"
    )
    return None


def save_findings(findings: Findings, path: Path) -> None:
    """Write findings atomically (an interrupted run leaves the old file or none)."""
    atomic_write_text(
        Path(path), finite_json.dumps(findings.to_dict(), indent=1, sort_keys=False, default=float) + "\n"
    )


def load_findings(path: str | Path, kind: str, as_type: type[F] | None = None) -> F:
    """Read and check a findings file of the given kind (a finder's name, see
    :mod:`surgery.find.finders`), as ``as_type`` (the kind's record class; default
    :class:`Findings`, the common head)."""
    path, command = Path(path).expanduser(), finder(kind).find_command  # ~ as a shell would, for Python callers
    if path.is_dir():  # "does not exist" would be false, and the fix is to name the file inside
        raise FindingsError(
            f"findings file {path} is a folder; give the findings JSON written by surgery {command} "
            f"(its --out, e.g. {path / (kind + '.json')})"
        )
    if not path.is_file():
        raise FindingsError(f"findings file {path} does not exist; give a file written by surgery {command}")
    try:
        data = load_json(path.read_text(encoding="utf-8"))
    except DuplicateKey as exc:
        raise FindingsError(
            f"findings file {path}: {exc.what}; surgery writes each key once, so the file "
            f"was edited: recompute it with surgery {command}"
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FindingsError(
            f"findings file {path} is not valid JSON ({exc.__class__.__name__}); recompute it with surgery " + command
        ) from None
    return (as_type or Findings).from_dict(data, where=str(path), kind=kind)


def check_model(findings: Findings, ckpt: Checkpoint, allow_transfer: bool = False) -> str | None:
    """Findings must come from this model, or (``allow_transfer``) one of the same architecture.

    Unlike a recipe's base_model, findings record the model's fingerprint, so "this model" means
    the same weights, whatever the path. Returns the note to show (and record) when findings of
    another model are applied under ``allow_transfer``, else None.
    """
    recorded = findings.model
    here = ModelIdentity.of(ckpt)
    if recorded.fingerprint == here.fingerprint:
        return None
    same_arch = recorded.model_type == here.model_type and recorded.geometry == here.geometry
    if allow_transfer and same_arch:
        return (
            f"the findings were computed on another model ({recorded.path}) of the same "
            f"architecture; applying them to {ckpt.origin} as --transfer asks"
        )
    if same_arch:
        raise FindingsError(
            f"the findings were computed on another model ({recorded.path}) of the same "
            "architecture; pass {transfer} to apply them anyway (e.g. instruct → base)",
            switches=("transfer",),
        )
    raise FindingsError(
        f"the findings were computed on a different model ({recorded.path}) and cannot be applied to "
        f"{ckpt.origin}{', even with {transfer},' if allow_transfer else ''} because its architecture "
        f"differs ({_differences(recorded, here)}); compute findings for this model with surgery "
        f"{finder(findings.kind if findings.kind in kinds() else 'heads').find_command}",
        switches=("transfer",) if allow_transfer else (),
    )


def _differences(recorded: ModelIdentity, here: ModelIdentity, most: int = 4) -> str:
    """``num_layers 30 there, 3 here; num_heads 9 there, 4 here``: what keeps findings of one model
    from another (the model type, then each geometry field that differs)."""
    there = {"model_type": recorded.model_type, **(recorded.geometry or {})}
    mine = {"model_type": here.model_type, **(here.geometry or {})}
    keys = [k for k in dict.fromkeys([*there, *mine]) if there.get(k) != mine.get(k)]
    shown = [f"{k} {there.get(k, 'absent')} there, {mine.get(k, 'absent')} here" for k in keys[:most]]
    return "; ".join(shown) + (f"; and {len(keys) - most} more" if len(keys) > most else "")


def new_findings(
    kind: str, ckpt: Checkpoint, dataset_sha256: str, params: Mapping[str, Any], tool_version: str
) -> dict[str, Any]:
    """The common head of every findings file, as the JSON a finder adds its results to (and then
    reads as its kind's record)."""
    assert kind in kinds()
    return Findings(
        kind=kind,
        tool_version=tool_version,
        model=ModelIdentity.of(ckpt),
        dataset_sha256=dataset_sha256,
        parameters=dict(params),
    ).to_dict()


def dtype_key(load) -> dict[str, str]:
    """What a cache key adds for ``load``'s compute dtype: nothing for float32 (keys as before),
    else the dtype, so bfloat16 findings are cached apart (their sums are float32 either way)."""
    from ..model.loading import compute_dtype
    from ..model.placement import dtype_name

    name = dtype_name(compute_dtype(load))
    return {} if name == "float32" else {"model_dtype": name}


def compute_record(model) -> dict[str, str]:
    """Where and in what precision a finder ran the model (findings record it; sums are float32)."""
    from ..model.placement import dtype_name, input_device
    from ..model.upcast import compute_dtype_of

    placed = getattr(model, "hf_device_map", None)
    return {
        "dtype": dtype_name(compute_dtype_of(model)),
        "device": str(input_device(model)),
        **({"device_map": "accelerate"} if placed else {}),
    }


@dataclass
class Found:
    """Findings of either kind as the commands use them: the typed findings, the file they live in,
    whether they came from the cache, and the note when --transfer applied another model's findings.

    Subclasses (``HeadFindings``, ``NeuronFindings``) set ``kind`` and ``record_type`` (the kind's
    :class:`Findings` class) and turn a selection into a :class:`~surgery.core.edits.Recipe`. Both
    are checked against the model they are applied to, from a user's file as from the cache.
    """

    data: Findings
    path: Path
    from_cache: bool
    transfer_note: str | None = None

    kind: ClassVar[str] = ""
    record_type: ClassVar[type[Findings]] = Findings

    @classmethod
    def read(cls, path: str | Path, ckpt: Checkpoint, transfer: bool = False) -> Found:
        """A findings file given by the user, checked against ``ckpt`` (``transfer``: same architecture)."""
        data = load_findings(path, cls.kind, cls.record_type)
        note = check_model(data, ckpt, allow_transfer=transfer)
        return cls(data, Path(path), from_cache=True, transfer_note=note)

    @classmethod
    def cached(cls, path: Path, ckpt: Checkpoint) -> Found | None:
        """The cache entry at ``path`` when it is sound and of this model; None when it is missing,
        damaged or stale (it is then recomputed: a cache entry is never trusted over a fresh run)."""
        if not path.is_file():
            return None
        try:
            found = cls.read(path, ckpt)
            found.check()
        except SurgeryError:
            return None
        return found

    def check(self) -> None:
        """Raise a SurgeryError when the content is not usable (subclasses check their part)."""

    def options(self) -> str:
        """The finder's options these findings were computed with, as a user reads them (subclasses)."""
        return "its recorded parameters"

    def record(self) -> dict[str, Any]:
        """What a bake records (in surgery.json) about the findings its edits came from."""
        return {"file": str(self.path), "transfer": self.transfer_note is not None}
