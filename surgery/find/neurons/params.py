"""What find-neurons and prune-neurons are asked to do: where the pairs come from and how neurons
are chosen, as typed objects from the command line to the code (torch-free: the CLI builds its
options from these fields at start-up, see surgery.core.options)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.comma_list import comma_items
from ...core.errors import RecipeError
from ...core.options import check_options, param

SCORES = ("bias", "signed", "fairness")
RULES = ("global", "per-category", "intersection")
DEFAULT_SCORE = "fairness"
DEFAULT_RULE = "per-category"
DEFAULT_BIAS_WEIGHT = 0.8
# A layer's most active neurons are never chosen: on SmolLM2 the raw BiasScore concentrates in the
# last layer's massive-activation neurons, and removing those breaks the model.
DEFAULT_SPARE = 0.01


def categories_of(values: tuple[str, ...]) -> tuple[str, ...] | None:
    """--category may be repeated or comma-separated; None means every category."""
    names = tuple(c for v in values for c in comma_items(v, "categories", "Gender,Religion"))
    return names or None


def parse_layers(spec: str | None) -> list[int] | None:
    """``"20-29"`` or ``"0,5,28-29"`` → layer list (None: every layer)."""
    if spec is None:
        return None
    parts = comma_items(spec, "layers", "0,5,28-29", RecipeError)
    if not parts:  # `--layers "$LAYERS"` with the variable unset: not "every layer" without a word
        raise RecipeError("--layers is empty; give layers like 20-29 or 0,5,28-29, or leave it out for every layer")
    layers: list[int] = []
    for part in parts:
        try:
            lo, _, hi = part.partition("-")
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise RecipeError(f"--layers: '{part}' is not a layer or a range like 20-29") from None
        if first > last:
            raise RecipeError(f"--layers: range '{part}' runs backwards; write {last}-{first}")
        layers.extend(range(first, last + 1))
    return sorted(set(layers))


@dataclass(frozen=True)
class CaptureParams:
    """Where the prompt pairs come from and how they are run through the model."""

    pairs: str = param("builtin", "'builtin' (our EN/ES sets), our JSONL format, or the public fairness-pruning JSON.")
    language: str | None = param(
        None, "Language of the pairs (builtin default: en; files: all languages).", choices=("en", "es")
    )
    categories: tuple[str, ...] = param(
        (), "Only these categories (repeat or comma-separate), e.g. Gender,Religion.", flag="--category", multiple=True
    )
    strict: bool = param(
        False, "Pairs whose prompts tokenize to different lengths are an error, not skipped.", is_flag=True
    )
    batch_size: int = param(16, "Pairs per forward pass.", minimum=1)

    def __post_init__(self) -> None:
        check_options(self)

    @property
    def category_list(self) -> tuple[str, ...] | None:
        return categories_of(self.categories)


@dataclass(frozen=True)
class SelectParams:
    """How neurons are ranked and chosen from findings (the n comes with each bake)."""

    score: str = param(
        DEFAULT_SCORE,
        "bias: mean |Δ activation|; signed: |mean (stereotyped − other)|; fairness: "
        "per-layer min-max of bias, weighted against PPM.",
        choices=SCORES,
    )
    rule: str = param(
        DEFAULT_RULE,
        "global: top n pooled; per-category: each category's best in turn; "
        "intersection: neurons in every category's top list.",
        flag="--select",
        choices=RULES,
    )
    bias_weight: float = param(
        DEFAULT_BIAS_WEIGHT, "w of the fairness score: w·bias + (1 − w)·(1 − PPM).", minimum=0, maximum=1
    )
    layers: str | None = param(None, "Only these layers, e.g. 20-29 or 0,5,28-29.", kind="str")
    spare_active: float = param(
        DEFAULT_SPARE,
        "Never choose this fraction of each layer's most active neurons "
        "(massive activations: removing them breaks the model); 0 turns it off.",
        minimum=0,
        maximum=1,
        max_open=True,
    )

    def __post_init__(self) -> None:
        check_options(self)
        self.layer_list()  # a malformed --layers fails now, not after the capture

    def layer_list(self) -> list[int] | None:
        return parse_layers(self.layers)

    def select_kwargs(self, categories: tuple[str, ...] | None) -> dict[str, Any]:
        """The keyword arguments of ``find.neurons.select.select`` these options stand for."""
        return {
            "score": self.score,
            "rule": self.rule,
            "bias_weight": self.bias_weight,
            "layers": self.layer_list(),
            "spare_active": self.spare_active,
            "categories": categories,
        }
