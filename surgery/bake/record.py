"""What a bake records about itself (surgery.json) and what export-lora records (surgery_adapter.json).

:class:`BakeRecord` is surgery.json as a typed, versioned record: the source it was baked from, the
recipe, one :class:`EditedTensor` per patch (the undo index), the numerical check, the card's
evaluation table, the undo data, every file's sha256 and how they were taken, and the seal. The
entries a command adds (a findings summary, the neuron selection, …) stay an ordered mapping,
``extra``, shown by the card under "Why". Files written by every earlier release read: bakes
without the source's fingerprint, with the logits check of the first release, without ``hashing``
or ``left_out_files``. ``to_dict`` lays a new record out exactly as the bake always wrote it; the
seal is computed on that dict (surgery.bake.provenance).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.edits import Recipe
from ..core.errors import VerificationError
from ..core.evaluation_table import Evaluation
from ..core.json_record import TEXT, Codec, JsonRecord, Malformed, entry, listof, mapof, part
from ..core.vectors import BakedVectors
from ..model.loading import Source

FORMAT = "surgery-checkpoint"
VERSION = 1
ADAPTER_FORMAT = "surgery-adapter"
ADAPTER_VERSION = 1


def _source(raw: Any, at: str) -> Source:
    if not isinstance(raw, Mapping):
        raise Malformed(at, "must be a JSON object with the source's 'path'")
    if not isinstance(raw.get("path"), str):
        raise Malformed(f"{at}.path", "must be the source folder (a string)")
    return Source(Path(raw["path"]), raw.get("hub_id"), raw.get("revision"), raw.get("fingerprint"))


SOURCE = Codec(_source, Source.to_dict)
RECIPE = Codec(lambda raw, at: Recipe.from_dict(raw, where=f"surgery.json {at}"), Recipe.to_dict)
NAMES = listof(TEXT)
HASHES = mapof(TEXT)


@dataclass(kw_only=True)
class EditedTensor(JsonRecord):
    """One patch of the bake: a tensor (or one expert's rows of a fused 3-D tensor) of one file,
    the rows and columns it changed, and the keys of their original bytes in surgery.undo. A
    direction edit rewrites the whole tensor (window): its weight, how much of the direction the
    rounding left (‖rᵀW′‖ / ‖rᵀW‖; absent when the matrix had none to remove), and the key of the
    whole original block. A steer edit's bias: ``direction_op`` "add", its weight c (b ← b + c·r)."""

    tensor: str
    file: str
    dtype: str
    rows: list[int]
    cols: list[int]
    first_row: int | None = None  # one expert's window of a fused tensor: its first row …
    window: int | None = None  # … and how many rows it spans
    direction_weight: float | None = None
    direction_left: float | None = None
    direction_op: str | None = None  # "add": a steer edit's bias (absent: a projection)
    rows_key: str | None = None
    cols_key: str | None = None
    block_key: str | None = None  # a projection: the original bytes of the whole tensor (window)

    @property
    def projected(self) -> bool:
        """Whether a direction was projected out of this tensor (every byte rewritten)."""
        return self.direction_weight is not None


@dataclass(kw_only=True)
class UndoRecord(JsonRecord):
    """What undo needs besides the edited slices: files the bake replaced (their originals are in
    surgery.undo), files it added (the card), and source files it left out."""

    file: str
    replaced_files: list[str] = entry(codec=NAMES)
    added_files: list[str] = entry(codec=NAMES)
    left_out_files: list[str] | None = entry(codec=NAMES, default=None)  # bakes before pickles were left out: none

    def rewritten(self) -> set[str]:
        """The files that are not the source's: replaced or added by the bake (the card)."""
        return set(self.replaced_files) | set(self.added_files)


@dataclass(kw_only=True)
class HashingRecord(JsonRecord):
    """Which sha256s the bake took rather than computed (surgery verify recomputes them all)."""

    source_files_from_hub_blob_names: list[str] = entry(codec=NAMES)
    source_files_from_hash_cache: list[str] | None = entry(codec=NAMES, default=None)  # before the hash cache: none
    files_from_source: list[str] = entry(codec=NAMES)
    computed: str
    recheck: str


@dataclass(kw_only=True)
class Verification(JsonRecord):
    """The bake's numerical check: ``kind`` "edited maps" (each edited weight map against the
    run-time edit); bakes of the first release compared whole-model logits instead (no ``kind``)."""

    kind: str | None = None
    maps: int | None = None
    inputs: int | None = None
    max_abs_diff: float | None = None
    max_diff_over_bound: float | None = None
    max_abs_logit_diff: float | None = None  # the logits check
    tolerance: float | None = None
    prompts: int | None = None
    reference: str | None = None
    end_to_end: str | None = None

    @property
    def compared_logits(self) -> bool:
        """Whether this is the first release's whole-model logits check."""
        return self.max_abs_logit_diff is not None


@dataclass(kw_only=True)
class Pushed(JsonRecord):
    """Where a folder was pushed (surgery.ship.hub.push); a command shows it, the bake never writes it."""

    repo: str
    url: str
    revision: str
    commit: str
    commit_url: str
    pr_url: str | None = entry(default=None, keep_none=True)
    checked: str


@dataclass(kw_only=True)
class BakeRecord(JsonRecord):
    """surgery.json (see the module docstring); ``extra`` holds the baking command's entries."""

    format: str = FORMAT
    version: int = VERSION
    tool_version: str
    created: str
    source: Source = entry(codec=SOURCE)
    model_type: str
    recipe: Recipe = entry(codec=RECIPE)
    edited_tensors: list[EditedTensor] = entry(codec=listof(part(EditedTensor)))
    verification: Verification | None = entry(codec=part(Verification), default=None)  # None: --no-verify
    evaluation: Evaluation | None = entry(codec=part(Evaluation), default=None)
    undo: UndoRecord = entry(codec=part(UndoRecord))
    files: dict[str, str] = entry(codec=HASHES)
    source_files: dict[str, str] = entry(codec=HASHES)
    hashing: HashingRecord | None = entry(codec=part(HashingRecord), default=None)
    pushed: Pushed | None = entry(codec=part(Pushed), default=None)
    seal: str | None = entry("provenance_sha256", default=None)  # surgery.bake.provenance.provenance_text

    EXTRA_AFTER = "edited_tensors"
    LABEL = "surgery.json"
    ERROR = VerificationError
    FIX = "it was edited after the bake: bake again"

    @classmethod
    def from_dict(cls, raw: Any, where: str | None = None) -> BakeRecord:
        where = where or cls.LABEL
        if not isinstance(raw, Mapping) or raw.get("format") != FORMAT:
            raise VerificationError(f"{where} is not a surgery provenance file")
        if raw.get("version") != VERSION:
            raise VerificationError(
                f"{where} has surgery.json version {raw.get('version')!r}; this surgery reads "
                f"version {VERSION}: upgrade surgery to read it"
            )
        return super().from_dict(raw, where)

    def replayable_recipe(self, folder: Path) -> Recipe:
        """The recipe with the unit vectors of its direction edits read back from the bake's
        ``folder``/surgery.vectors, so that it can be planned and replayed (verify, push's copy
        check, export-lora); a recipe without direction edits as read."""
        if not self.recipe.directions:
            return self.recipe
        return Recipe.from_dict(
            self.recipe.to_dict(), where=f"{Path(folder) / self.LABEL} recipe", vectors=BakedVectors(folder)
        )

    def edited_pairs(self) -> list[tuple[str, str]]:
        """The distinct (file, tensor) pairs the bake edited: a fused 3-D expert tensor is patched
        one expert's window at a time, so counting the entries would count windows as tensors."""
        return sorted({(e.file, e.tensor) for e in self.edited_tensors})

    def weight_hashes(self) -> dict[str, str]:
        """The sha256 of each weight file (*.safetensors): the bake's identity.

        A checkpoint's fingerprint samples 1 MiB per file, so it rarely tells a bake from its source
        or from a bake of another α; these hashes do, and reading them costs nothing.
        """
        return {name: digest for name, digest in self.files.items() if name.endswith(".safetensors")}


@dataclass(kw_only=True)
class AdapterRecord(JsonRecord):
    """surgery_adapter.json, what export-lora records in an adapter folder; ``extra`` holds the
    number of edits of each registered kind (``"heads": 2, "neurons": 40``, …)."""

    format: str = ADAPTER_FORMAT
    version: int = ADAPTER_VERSION
    tool_version: str
    source: Source = entry(codec=SOURCE)
    model_type: str
    recipe: Recipe = entry(codec=RECIPE)
    vllm: bool
    max_rank: int
    modules: dict[str, int]  # module name → its LoRA rank
    # The sha256 of every other file of the adapter folder (absent from earlier adapters): what
    # --force may replace (surgery.core.destinations).
    files: dict[str, str] | None = entry(codec=HASHES, default=None)

    LABEL = "surgery_adapter.json"
    ERROR = VerificationError
    FIX = "export the adapter again"

    @classmethod
    def from_dict(cls, raw: Any, where: str | None = None) -> AdapterRecord:
        where = where or cls.LABEL
        if not isinstance(raw, Mapping) or raw.get("format") != ADAPTER_FORMAT:
            raise VerificationError(f"{where} is not a surgery adapter record")
        if raw.get("version") != ADAPTER_VERSION:
            raise VerificationError(
                f"{where} has adapter record version {raw.get('version')!r}; this surgery "
                f"reads version {ADAPTER_VERSION}: upgrade surgery to read it"
            )
        return super().from_dict(raw, where)
