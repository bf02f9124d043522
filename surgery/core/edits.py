"""The recipe: a list of edits for one base model, as stored in a recipe YAML file.

Each edit is an instance of a registered edit kind (surgery/core/edit_kind.py): ``head``
(surgery/core/head_edit.py), ``neuron`` (surgery/core/neuron_edit.py), ``direction`` and ``steer``
(surgery/core/direction_edit.py) are built in. One edit is
applied three ways — as a run-time hook (model/hooks.py), baked into tensors (bake/bake.py) and
exported as a LoRA adapter (bake/lora.py) — all three from the sites its kind maps it to
(surgery/core/sites.py), and tests prove the three agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from .architectures import Architecture, architecture
from .counted import in_number
from .direction_edit import DirectionEdit, SteerEdit
from .edit_kind import FLOAT32_MAX, Edit, edit_from_dict, edit_kinds, edit_to_dict, register_edit_kind
from .errors import RecipeError
from .head_edit import HeadScale, parse_heads
from .neuron_edit import SHARED, NeuronScale, neuron_label, parse_neuron, parse_neurons
from .strict_files import DuplicateKey, dump_yaml, load_yaml
from .vectors import BakedVectors, FolderVectors, VectorSource

__all__ = [
    "RECIPE_VERSION",
    "FLOAT32_MAX",
    "SHARED",
    "BakedVectors",
    "DirectionEdit",
    "SteerEdit",
    "Edit",
    "FolderVectors",
    "HeadScale",
    "NeuronScale",
    "Recipe",
    "VectorSource",
    "deduplicate",
    "edit_from_dict",
    "edit_kinds",
    "edit_to_dict",
    "neuron_label",
    "parse_heads",
    "parse_neuron",
    "parse_neurons",
    "register_edit_kind",
]

RECIPE_VERSION = 1


def deduplicate(edits: Iterable[Edit]) -> tuple[Edit, ...]:
    """Drop exact repeats; two different settings for one target are an error."""
    seen: dict[tuple, Edit] = {}
    for e in edits:
        prior = seen.get(e.target)
        if prior is not None and prior != e:
            raise RecipeError(f"conflicting edits for {e.kind} {e.label}: {prior.setting} and {e.setting}; keep one")
        seen[e.target] = e
    return tuple(seen.values())


@dataclass(frozen=True)
class Recipe:
    """A list of edits for one base model, as stored in a recipe YAML file."""

    edits: tuple[Edit, ...]
    base_model: str | None = None
    version: int = RECIPE_VERSION
    notes: dict[str, Any] = field(default_factory=dict)
    # The parameter whose value named the edits (``heads`` for --heads 7.7,8.17), when not a recipe
    # file: its errors then name it and the edit as typed, not ``edits[i]``. Not written anywhere.
    named_by: str | None = field(default=None, compare=False)
    # The file it was read from (its name) and each edit's place in that file's list (an exact repeat is
    # dropped, which would shift the later places): its errors then name the file and the place the user
    # wrote. Not written anywhere.
    source: str | None = field(default=None, compare=False)
    places: tuple[int, ...] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # a bare edit, or tuples / dicts in place of edits, failed as "not iterable" / "no attribute 'target'"
        if isinstance(self.edits, Edit) or not isinstance(self.edits, Iterable):
            raise RecipeError(
                f"Recipe's edits must be a sequence of edits, got {type(self.edits).__name__}; "
                "write Recipe((edit,)) for one edit"
            )
        edits = tuple(self.edits)
        for i, e in enumerate(edits):
            if not isinstance(e, Edit):
                hint = "; a recipe's mapping is read by Recipe.from_dict" if isinstance(e, Mapping) else ""
                raise RecipeError(
                    f"edits[{i}] is a {type(e).__name__}, not an edit: give HeadScale, NeuronScale or "
                    f"another registered edit kind{hint}"
                )
        object.__setattr__(self, "edits", deduplicate(edits))

    def of_kind(self, kind: type[Edit]) -> list[Edit]:
        """The edits of one kind, in recipe order."""
        return [e for e in self.edits if isinstance(e, kind)]

    @property
    def heads(self) -> list[HeadScale]:
        return self.of_kind(HeadScale)

    @property
    def neurons(self) -> list[NeuronScale]:
        return self.of_kind(NeuronScale)

    @property
    def directions(self) -> list[DirectionEdit]:
        return self.of_kind(DirectionEdit)

    def active(self) -> tuple[Edit, ...]:
        """The edits that change anything (α = 1, factor = 1 and weight = 0 are no-ops)."""
        return tuple(e for e in self.edits if not e.is_identity())

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "base_model": self.base_model}
        if self.notes:
            out["notes"] = self.notes
        out["edits"] = [edit_to_dict(e) for e in self.edits]
        return out

    def to_yaml(self, header: str = "") -> str:
        """YAML that ``Recipe.load`` reads back to an equal recipe; ``header`` becomes # comments."""
        # YAML refuses control characters anywhere, comments included: write them as escapes.
        safe = "".join(c if c.isprintable() or c == "\n" else c.encode("unicode_escape").decode() for c in header)
        comment = "".join(f"# {line}\n" if line else "#\n" for line in safe.splitlines())
        data = self.to_dict()
        text = dump_yaml(data)
        if load_yaml(text) != data:  # PyYAML writes U+0085 / U+2028 raw, and they read back as spaces
            text = dump_yaml(data, allow_unicode=False)
        return comment + text

    @classmethod
    def from_dict(cls, raw: Any, where: str = "recipe", vectors: VectorSource | str | Path | None = None) -> Recipe:
        """Parse a recipe; ``vectors`` reads the vector files of direction edits (a folder: paths are
        relative to it; a baked folder's record: ``BakedVectors``; None: not read, the recipe can then
        be shown but not baked)."""
        if isinstance(vectors, (str, Path)):
            vectors = FolderVectors(vectors)
        if not isinstance(raw, Mapping):
            raise RecipeError(f"{where} must be a YAML mapping with 'version' and 'edits'")
        unknown = sorted(set(raw) - {"version", "base_model", "edits", "notes"})
        if unknown:
            raise RecipeError(
                f"{where}: unknown {in_number(len(unknown), 'key')} {', '.join(map(str, unknown))} (allowed: version, base_model, edits, notes)"
            )
        if "version" not in raw:
            raise RecipeError(f"{where} has no version: add 'version: {RECIPE_VERSION}' (the recipe format's version)")
        version = raw.get("version")
        if version != RECIPE_VERSION:
            raise RecipeError(f"{where}.version must be {RECIPE_VERSION}, got {version!r}")
        edits = raw.get("edits")
        if not isinstance(edits, list) or not edits:
            raise RecipeError(f"{where}.edits must be a non-empty list of edits ({', '.join(sorted(edit_kinds()))})")
        base = raw.get("base_model")
        if base is not None and not isinstance(base, str):
            raise RecipeError(f"{where}.base_model must be a string, got {base!r}")
        notes = raw.get("notes") or {}
        if not isinstance(notes, Mapping):
            raise RecipeError(f"{where}.notes must be a mapping")
        parsed = [edit_from_dict(e, f"{where}.edits[{i}]", vectors) for i, e in enumerate(edits)]
        recipe = cls(tuple(parsed), base, version, dict(notes))
        # deduplicate keeps each first occurrence: its place in the file's list
        return replace(recipe, places=tuple(next(i for i, p in enumerate(parsed) if p is e) for e in recipe.edits))

    @classmethod
    def load(cls, path: str | Path) -> Recipe:
        path = Path(path).expanduser()  # ~ as a shell would: a Python caller's string is not expanded
        if path.is_dir():  # e.g. a baked folder: "does not exist" would be false
            raise RecipeError(
                f"recipe file {path} is a folder; give the path of a recipe YAML file (a baked folder "
                "records its recipe under 'recipe' in its surgery.json)"
            )
        if not path.is_file():
            raise RecipeError(f"recipe file {path} does not exist; give the path of a recipe YAML file")
        try:
            raw = load_yaml(path.read_text(encoding="utf-8"))
        except DuplicateKey as exc:  # PyYAML would keep the last one: two recipes in one file lose edits
            raise RecipeError(
                f"recipe file {path}: {exc.what}; a recipe gives each key once (two recipes "
                "pasted into one file?): keep one"
            ) from None
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            # PyYAML's message spans several lines; keep the problem and where it is.
            mark = getattr(exc, "problem_mark", None)
            what = getattr(exc, "problem", None) or type(exc).__name__
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise RecipeError(f"recipe file {path} is not valid YAML ({what}{at}); fix the syntax") from None
        if raw is None:
            raise RecipeError(f"recipe file {path} is empty; it needs 'version' and 'edits'")
        return replace(cls.from_dict(raw, where=path.name, vectors=FolderVectors(path.parent)), source=path.name)

    def validate(self, config: Mapping[str, Any]) -> Architecture:
        """Check every edit against the model's config; return its architecture. An error names
        the edit as ``edits[i]``, or (``named_by``) as the parameter and the edit's label:
        ``{heads} 9.9: layer = 9 but the model has num_hidden_layers = 3``."""
        arch = architecture(config)
        for i, e in enumerate(self.edits):
            where = f"edits[{self.places[i] if self.places else i}]"
            where = f"{self.source}.{where}" if self.source else where
            try:
                e.check_values(where)
                e.validate(arch, where)
            except RecipeError as exc:
                if self.named_by is None:
                    raise
                what = str(exc).removeprefix(where).removeprefix(".").removeprefix(": ")
                raise RecipeError(f"{{{self.named_by}}} {e.label}: {what}", self.named_by) from None
        return arch
