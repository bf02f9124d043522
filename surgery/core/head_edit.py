"""The ``head`` edit kind: scale one attention head's output by α (its output projection's columns)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from .comma_list import comma_items, no_repeats
from .edit_kind import Edit, check_layer, check_scale, index, layer_list, number, recipe_key, register_edit_kind
from .errors import RecipeError
from .sites import Site

if TYPE_CHECKING:
    from .architectures import Architecture


@register_edit_kind
@dataclass(frozen=True)
class HeadScale(Edit):
    """Scale attention head ``head`` of ``layer`` by ``alpha`` (its o_proj input columns)."""

    kind: ClassVar[str] = "head"
    scale_key: ClassVar[str] = "alpha"

    layer: int = recipe_key(index)
    head: int = recipe_key(index)
    alpha: float = recipe_key(number)

    @property
    def target(self) -> tuple[str, int, int, None]:
        return ("head", self.layer, self.head, None)

    @property
    def label(self) -> str:
        return f"{self.layer}.{self.head}"

    @property
    def scale(self) -> float:
        return self.alpha

    @property
    def setting(self) -> str:
        return f"{self.alpha}"

    def is_identity(self) -> bool:
        return self.alpha == 1.0

    def validate(self, arch: Architecture, where: str) -> None:
        check_scale(self.alpha, where)
        if arch.layout.limits.head_refusal:
            raise RecipeError(f"{where}: {arch.model_type} has no head edits: {arch.layout.limits.head_refusal}")
        check_layer(arch, self.layer, where)
        n, key = arch.at(self.layer).geometry.num_heads, arch.layout.config.keys.num_attention_heads
        if self.head >= n:
            raise RecipeError(f"{where}.head = {self.head} but the model has {key} = {n} (valid: 0..{n - 1})")
        check_head_layer(arch, self.layer, where)

    def sites(self, arch: Architecture) -> list[Site]:
        """A head is the d input columns of o_proj that carry its output (d: its layer's head_dim;
        DeepSeek-V4: within the rows of its group of the grouped o_a_proj)."""
        arch = arch.at(self.layer)
        o_proj = arch.layout.attention.o_proj
        shape, _ = arch.attention_shapes()[o_proj]
        cols = arch.head_columns(self.head)
        return [
            Site(
                self.layer,
                o_proj,
                "in",
                tuple(range(cols.start, cols.stop)),
                self.alpha,
                shape,
                True,
                group=arch.head_group(self.head),
            )
        ]

    def lora_refusal(self, arch: Architecture) -> str | None:
        # PEFT wraps a grouped linear as a plain Linear: its adapter would mix the groups.
        if arch.layout.attention.grouped_output:
            return (
                f"{arch.model_type}'s grouped o_a_proj has no exact LoRA adapter (PEFT treats it as a plain "
                "Linear); ship the baked checkpoint instead"
            )
        return None

    def card_row(self, where: str) -> tuple[str, str, str, str, str]:
        effect = "head removed" if self.alpha == 0 else f"head output × {self.alpha:g}"
        return ("attention head", str(self.layer), str(self.head), f"α = {self.alpha:g}", f"{effect} ({where})")

    def card_tags(self) -> tuple[str, ...]:
        return ("attention-heads",)


def check_head_layer(arch: Architecture, layer: int, where: str, what: str = "attention heads to scale") -> None:
    """``layer`` has attention heads at o_proj (a hybrid model's other layers have none); ``what``
    says what the edit needs of them."""
    if layer not in arch.head_layers():
        raise RecipeError(
            f"{where}.layer = {layer} is a {arch.layer_kind(layer)} layer of this {arch.model_type} "
            f"model: it has no {what} (heads are in its "
            f"{' and '.join(arch.layout.layers.layer_kinds.editable)} layers: "
            f"{layer_list(arch.head_layers())}); choose one of those"
        )


def parse_heads(spec: str, alpha: float) -> list[HeadScale]:
    """Parse ``"7.7,8.17"`` (layer.head pairs) from the command line; an empty item or a head
    named twice is refused."""
    out = []
    for part in comma_items(spec, "heads", "7.7,8.17", RecipeError):
        try:
            layer, head = (int(x) for x in part.split("."))
        except ValueError:
            raise RecipeError(f"--heads: '{part}' is not LAYER.HEAD (e.g. 7.7,8.17)") from None
        out.append(HeadScale(layer, head, alpha))
    if not out:
        raise RecipeError("--heads is empty; give LAYER.HEAD pairs such as 7.7,8.17")
    no_repeats((f"{h.layer}.{h.head}" for h in out), "heads", "head", RecipeError)
    return out
