"""The edit types and the recipe that lists them.

One ``Edit`` is applied three ways — as a run-time hook (model/hooks.py), baked into tensors
(bake/bake.py) and exported as a LoRA adapter (ship/lora.py) — all three from the tensor entries that
surgery/core/sites.py maps it to, and tests prove the three agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Union

import yaml

from .architectures import Architecture, architecture
from .errors import RecipeError
from .strict_files import DuplicateKey, load_yaml

RECIPE_VERSION = 1
FLOAT32_MAX = 3.4028234663852886e38
# The ``expert`` of a shared-expert neuron (Qwen2-MoE), in recipes and in the notation L:s:N.
SHARED = "shared"


@dataclass(frozen=True)
class HeadScale:
    """Scale attention head ``head`` of ``layer`` by ``alpha`` (its o_proj input columns)."""

    layer: int
    head: int
    alpha: float

    @property
    def target(self) -> tuple[str, int, int, int | str | None]:
        return ("head", self.layer, self.head, None)

    @property
    def label(self) -> str:
        return f"{self.layer}.{self.head}"

    @property
    def scale(self) -> float:
        return self.alpha

    def is_identity(self) -> bool:
        return self.alpha == 1.0


@dataclass(frozen=True)
class NeuronScale:
    """Scale MLP neuron ``neuron`` of ``layer`` by ``factor``; 0 prunes it (gate/up rows too).

    In a mixture-of-experts layer ``expert`` names the routed expert (an index) or ``"shared"``;
    the notation is ``L:N`` (dense), ``L:eE:N`` (routed expert E), ``L:s:N`` (shared expert).
    """

    layer: int
    neuron: int
    factor: float
    expert: int | str | None = None

    @property
    def target(self) -> tuple[str, int, int, int | str | None]:
        return ("neuron", self.layer, self.neuron, self.expert)

    @property
    def label(self) -> str:
        return neuron_label(self.layer, self.neuron, self.expert)

    @property
    def scale(self) -> float:
        return self.factor

    def is_identity(self) -> bool:
        return self.factor == 1.0


Edit = Union[HeadScale, NeuronScale]


def neuron_label(layer: int, neuron: int, expert: int | str | None = None) -> str:
    """The one notation of a neuron: ``28:17``, ``3:e5:17`` (routed expert 5), ``3:s:17`` (shared)."""
    if expert is None:
        return f"{layer}:{neuron}"
    return f"{layer}:{'s' if expert == SHARED else f'e{expert}'}:{neuron}"

_EDIT_KEYS = {
    "head": ("layer", "head", "alpha"),
    "neuron": ("layer", "neuron", "factor"),
}


def _number(value: Any, where: str, integer: bool) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecipeError(f"{where} must be a number, got {value!r}")
    if integer:
        if not isinstance(value, int):
            raise RecipeError(f"{where} must be an integer, got {value!r}")
        if value < 0:
            raise RecipeError(f"{where} must be ≥ 0, got {value}")
        return value
    if not math.isfinite(value):
        raise RecipeError(f"{where} must be a finite number, got {value!r}")
    return float(value)


def edit_from_dict(raw: Any, where: str = "edit") -> Edit:
    """Parse one recipe entry such as ``{type: head, layer: 7, head: 7, alpha: 2.5}``."""
    if not isinstance(raw, Mapping):
        raise RecipeError(f"{where} must be a mapping with a 'type', got {raw!r}")
    kind = raw.get("type")
    if kind not in _EDIT_KEYS:
        raise RecipeError(f"{where}.type must be 'head' or 'neuron', got {kind!r}")
    keys = _EDIT_KEYS[kind]
    allowed = set(keys) | {"type"} | ({"expert"} if kind == "neuron" else set())
    unknown = sorted(set(raw) - allowed)
    if unknown:
        extra = ", expert" if kind == "neuron" else ""
        raise RecipeError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: type, {', '.join(keys)}{extra})")
    missing = [k for k in keys if k not in raw]
    if missing:
        raise RecipeError(f"{where}: missing key(s) {', '.join(missing)}")
    layer = _number(raw[keys[0]], f"{where}.{keys[0]}", True)
    index = _number(raw[keys[1]], f"{where}.{keys[1]}", True)
    value = _number(raw[keys[2]], f"{where}.{keys[2]}", False)
    if kind == "head":
        return HeadScale(layer, index, value)
    expert = raw.get("expert")
    if expert is not None and expert != SHARED:
        expert = _number(expert, f"{where}.expert", True)
    return NeuronScale(layer, index, value, expert)


def edit_to_dict(edit: Edit) -> dict[str, Any]:
    if isinstance(edit, HeadScale):
        return {"type": "head", "layer": edit.layer, "head": edit.head, "alpha": edit.alpha}
    out: dict[str, Any] = {"type": "neuron", "layer": edit.layer}
    if edit.expert is not None:
        out["expert"] = edit.expert
    return {**out, "neuron": edit.neuron, "factor": edit.factor}


def deduplicate(edits: Iterable[Edit]) -> tuple[Edit, ...]:
    """Drop exact repeats; two different scales for one head or neuron are an error."""
    seen: dict[tuple[str, int, int], Edit] = {}
    for e in edits:
        prior = seen.get(e.target)
        if prior is not None and prior != e:
            raise RecipeError(
                f"conflicting edits for {e.target[0]} {e.label}: {prior.scale} and {e.scale}; keep one"
            )
        seen[e.target] = e
    return tuple(seen.values())


@dataclass(frozen=True)
class Recipe:
    """A list of edits for one base model, as stored in a recipe YAML file."""

    edits: tuple[Edit, ...]
    base_model: str | None = None
    version: int = RECIPE_VERSION
    notes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "edits", deduplicate(self.edits))

    @property
    def heads(self) -> list[HeadScale]:
        return [e for e in self.edits if isinstance(e, HeadScale)]

    @property
    def neurons(self) -> list[NeuronScale]:
        return [e for e in self.edits if isinstance(e, NeuronScale)]

    def active(self) -> tuple[Edit, ...]:
        """The edits that change anything (α = 1 and factor = 1 are no-ops)."""
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
        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        if load_yaml(text) != data:  # PyYAML writes U+0085 / U+2028 raw, and they read back as spaces
            text = yaml.safe_dump(data, sort_keys=False, allow_unicode=False)
        return comment + text

    @classmethod
    def from_dict(cls, raw: Any, where: str = "recipe") -> "Recipe":
        if not isinstance(raw, Mapping):
            raise RecipeError(f"{where} must be a YAML mapping with 'version' and 'edits'")
        unknown = sorted(set(raw) - {"version", "base_model", "edits", "notes"})
        if unknown:
            raise RecipeError(f"{where}: unknown key(s) {', '.join(map(str, unknown))} "
                              "(allowed: version, base_model, edits, notes)")
        version = raw.get("version")
        if version != RECIPE_VERSION:
            raise RecipeError(f"{where}.version must be {RECIPE_VERSION}, got {version!r}")
        edits = raw.get("edits")
        if not isinstance(edits, list) or not edits:
            raise RecipeError(f"{where}.edits must be a non-empty list of head/neuron edits")
        base = raw.get("base_model")
        if base is not None and not isinstance(base, str):
            raise RecipeError(f"{where}.base_model must be a string, got {base!r}")
        notes = raw.get("notes") or {}
        if not isinstance(notes, Mapping):
            raise RecipeError(f"{where}.notes must be a mapping")
        parsed = [edit_from_dict(e, f"{where}.edits[{i}]") for i, e in enumerate(edits)]
        return cls(tuple(parsed), base, version, dict(notes))

    @classmethod
    def load(cls, path: str | Path) -> "Recipe":
        path = Path(path)
        if not path.is_file():
            raise RecipeError(f"recipe file {path} does not exist; give the path of a recipe YAML file")
        try:
            raw = load_yaml(path.read_text(encoding="utf-8"))
        except DuplicateKey as exc:  # PyYAML would keep the last one: two recipes in one file lose edits
            raise RecipeError(f"recipe file {path}: {exc.what}; a recipe gives each key once (two recipes "
                              "pasted into one file?): keep one") from None
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            # PyYAML's message spans several lines; keep the problem and where it is.
            mark = getattr(exc, "problem_mark", None)
            what = getattr(exc, "problem", None) or type(exc).__name__
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise RecipeError(f"recipe file {path} is not valid YAML ({what}{at}); fix the syntax") from None
        if raw is None:
            raise RecipeError(f"recipe file {path} is empty; it needs 'version' and 'edits'")
        return cls.from_dict(raw, where=path.name)

    def validate(self, config: Mapping[str, Any]) -> Architecture:
        """Check every index against the model's config; return its architecture."""
        arch = architecture(config)
        g = arch.geometry
        for i, e in enumerate(self.edits):
            where = f"edits[{i}]"
            index = e.head if isinstance(e, HeadScale) else e.neuron
            if e.layer < 0 or index < 0:
                raise RecipeError(f"{where}: layer and index must be ≥ 0, got {e.layer}.{index}")
            # Weights are at most float32: a larger scale turns into inf (and crashes the run-time twin).
            if not (math.isfinite(e.scale) and abs(e.scale) <= FLOAT32_MAX):
                raise RecipeError(f"{where}: scale {e.scale!r} is not a finite float32 number "
                                  f"(|scale| ≤ {FLOAT32_MAX:.3g}); choose a smaller value")
            if e.layer >= g.num_layers:
                raise RecipeError(f"{where}.layer = {e.layer} but the model has "
                                  f"num_hidden_layers = {g.num_layers} (valid: 0..{g.num_layers - 1})")
            if isinstance(e, HeadScale) and e.head >= g.num_heads:
                raise RecipeError(f"{where}.head = {e.head} but the model has "
                                  f"num_attention_heads = {g.num_heads} (valid: 0..{g.num_heads - 1})")
            if isinstance(e, NeuronScale):
                _check_neuron(arch, e, where)
        return arch


def _check_neuron(arch: Architecture, e: NeuronScale, where: str) -> None:
    """The neuron exists: in the dense MLP, the routed expert or the shared expert its layer has."""
    g, ex = arch.geometry, arch.layout.experts
    if e.expert is None:
        if arch.is_sparse(e.layer):
            raise RecipeError(f"{where}: layer {e.layer} is a mixture of experts; name the expert "
                              f"({e.layer}:eE:{e.neuron} for routed expert E"
                              f"{f', {e.layer}:s:{e.neuron} for the shared expert' if ex.shared else ''})")
        width, what = g.intermediate_size, "intermediate_size"
    elif not arch.is_sparse(e.layer):
        raise RecipeError(f"{where}.expert = {e.expert} but layer {e.layer} is a dense MLP "
                          "(no experts); drop 'expert'")
    elif e.expert == SHARED:
        if not ex.shared:
            raise RecipeError(f"{where}.expert = shared but {arch.model_type} has no shared expert")
        width, what = g.shared_size, ex.shared_size_key
    else:
        if e.expert >= g.num_experts:
            raise RecipeError(f"{where}.expert = {e.expert} but the model has {g.num_experts} experts per "
                              f"layer (valid: 0..{g.num_experts - 1})")
        width, what = g.expert_size, ex.size_key
    if e.neuron >= width:
        raise RecipeError(f"{where}.neuron = {e.neuron} but the model has {what} = {width} "
                          f"(valid: 0..{width - 1})")


def parse_heads(spec: str, alpha: float) -> list[HeadScale]:
    """Parse ``"7.7,8.17"`` (layer.head pairs) from the command line."""
    out = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        try:
            layer, head = (int(x) for x in part.split("."))
        except ValueError:
            raise RecipeError(f"--heads: '{part}' is not LAYER.HEAD (e.g. 7.7,8.17)") from None
        out.append(HeadScale(layer, head, alpha))
    if not out:
        raise RecipeError("--heads is empty; give LAYER.HEAD pairs such as 7.7,8.17")
    return out


def parse_neuron(text: str) -> tuple[int, int, int | str | None]:
    """``"28:17"`` → (28, 17, None); ``"3:e5:17"`` → (3, 17, 5); ``"3:s:17"`` → (3, 17, "shared")."""
    fields = text.split(":")
    try:
        expert: int | str | None = None
        if len(fields) == 3 and fields[1] == "s":
            expert = SHARED
        elif len(fields) == 3 and fields[1][:1] == "e" and fields[1][1:].isdigit():
            expert = int(fields[1][1:])
        elif len(fields) != 2:
            raise ValueError(text)
        layer, neuron = int(fields[0]), int(fields[-1])
    except ValueError:
        raise RecipeError(f"'{text}' is not LAYER:NEURON, LAYER:eEXPERT:NEURON or LAYER:s:NEURON "
                          "(e.g. 28:17, 3:e5:17, 3:s:17)") from None
    return layer, neuron, expert


def parse_neurons(spec: str, factor: float) -> list[NeuronScale]:
    """Parse ``"28:17,3:e5:17,3:s:2"`` (see :func:`neuron_label`) from the command line."""
    out = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        try:
            layer, neuron, expert = parse_neuron(part)
        except RecipeError as exc:
            raise RecipeError(f"--neurons: {exc}") from None
        out.append(NeuronScale(layer, neuron, factor, expert))
    if not out:
        raise RecipeError("--neurons is empty; give LAYER:NEURON pairs such as 28:17,28:901")
    return out
